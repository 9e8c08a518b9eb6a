"""The external-agent gateway's Ray-free core (issue 44): what an OpenAI-compatible call records
(``trace``), how recorded calls become training sequences, and the rollout lifecycle. The HTTP app
lives in ``serve/``; the job that trains from traces in ``jobs/train_agent.py``."""

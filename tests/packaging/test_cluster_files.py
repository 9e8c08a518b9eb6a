"""Every cluster definition passes the validation of the tool that reads it, offline, and agrees with
deploy/placement.yaml, the file the jobs' placement comes from (docs/cluster.md).

- cluster.yaml and deploy/aws-gpu.yaml: Ray's own ``prepare_config`` + ``validate_config``
  (``ray.autoscaler._private.util``) from the locked Ray (the test checks the version). Their
  commands are valid bash and use only ``ray start`` options this Ray has.
- deploy/k8s/*.yaml: the fields KubeRay requires (taken from KubeRay's CRDs and its validation
  webhook, v1.7). Token auth on a Ray version that supports it. The image and volumes are
  consistent, and every GPU group's ``num-gpus`` equals its pods' ``nvidia.com/gpu``.
- Placement: each RayJob's entrypoint is loaded the way its stage job loads it. The actors it will
  start (deploy/placement.yaml, profile gpu) must fit that RayJob's worker groups, the AWS node
  types and the RayService's group. The on-premise workers advertise the profile's custom
  resources, and jobs/runtime.py hands each actor its ask.
What this cannot show, no GPU, AWS account or Kubernetes being here, is that the files run on
such hardware: docs/cluster.md says so.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from curriculum.config import STAGES, load_stage_config
from curriculum.placement import ActorAsk, job_actors, load_profile, pool_shards, unplaced

ROOT = Path(__file__).resolve().parents[2]
IMAGE_ROOT = "/app"  # where deploy/Dockerfile.gpu puts the project
LAUNCHER_FILES = ["cluster.yaml", "deploy/aws-gpu.yaml"]
RAYJOBS = {stage: ROOT / "deploy" / "k8s" / f"rayjob-{stage}.yaml" for stage in STAGES}
RAYSERVICE = ROOT / "deploy" / "k8s" / "rayservice.yaml"
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def load(path: str | Path) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


def locked_ray() -> str:
    return re.search(r"^ray==([\w.]+)", (ROOT / "locks" / "cpu.txt").read_text(), re.M).group(1)


# --------------------------------------------------------------------------------- Ray's launcher

def test_validation_uses_the_locked_ray():
    import ray

    assert ray.__version__ == locked_ray()
    gpu = re.search(r"^ray==([\w.]+)", (ROOT / "locks" / "gpu.txt").read_text(), re.M).group(1)
    assert gpu == locked_ray(), "the GPU lock's Ray must be the CPU lock's (one cluster, one Ray)"


@pytest.mark.parametrize("path", LAUNCHER_FILES)
def test_ray_validates_the_cluster_file(path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(load(path)))
    validate_config(prepared)  # raises on any schema or consistency error
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_ray_validation_rejects_a_broken_file():
    """The check has teeth: what Ray rejects, this test would reject."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    broken = load("deploy/aws-gpu.yaml")
    broken["available_node_types"]["rollout_gpu"]["resources"]["GPU"] = 0.5  # resources are integers
    with pytest.raises(Exception, match="0.5"):
        validate_config(prepare_config(broken))
    broken = load("deploy/aws-gpu.yaml")
    broken["head_node_type"] = "nowhere"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(prepare_config(broken))


@pytest.fixture(scope="module")
def ray_start_options() -> set[str]:
    out = subprocess.run([str(Path(sys.executable).with_name("ray")), "start", "--help"], capture_output=True,
                         text=True, timeout=120).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]+)", out))


@pytest.mark.parametrize("path", LAUNCHER_FILES)
def test_commands_are_bash_and_ray_start_options_exist(path, ray_start_options):
    cfg = load(path)
    commands = [c for key in ("setup_commands", "head_setup_commands", "worker_setup_commands",
                              "head_start_ray_commands", "worker_start_ray_commands") for c in cfg.get(key) or []]
    for command in commands:
        check = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        assert check.returncode == 0, (command, check.stderr)
    starts = [c for c in cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2
    for command in starts:
        used = set(re.findall(r"(--[a-z][a-z0-9-]+)", command.split("ray start", 1)[1]))
        assert used <= ray_start_options, used - ray_start_options
        assert "--metrics-export-port=8080" in command and "RAY_AUTH_MODE=token" in command
    assert "RAY_PROMETHEUS_HOST=http://127.0.0.1:9090" in starts[0]  # the head's dashboard finds monitor.sh


def test_on_premise_file_installs_the_lock_and_advertises_the_gpu_resources():
    cfg = load("cluster.yaml")
    assert cfg["provider"]["type"] == "local" and cfg["provider"]["head_ip"] and cfg["provider"]["worker_ips"]
    assert any("bash scripts/setup.sh" in c for c in cfg["setup_commands"])
    assert any("scripts/monitor.sh install" in c for c in cfg["head_setup_commands"])
    worker = cfg["worker_start_ray_commands"][-1]
    for name in load_profile("gpu").custom_resources():
        assert f'\\"{name}\\":$G' in worker, name  # one per GPU the node has
    assert "~/.ray/auth_token" in cfg["file_mounts"]


def test_aws_nodes_hold_the_stage_jobs_and_declare_the_custom_resources():
    cfg = load("deploy/aws-gpu.yaml")
    types = cfg["available_node_types"]
    assert types[cfg["head_node_type"]]["resources"].get("GPU", 0) == 0  # a CPU head
    profile = load_profile("gpu")
    for kind in ("rollout", "learner"):
        for name, amount in profile.ask(kind).resources.items():
            hosts = [t for t in types.values() if t["resources"].get(name)]
            assert hosts, f"no node type declares {name}"
            assert all(t["resources"]["GPU"] >= t["resources"][name] * profile.ask(kind).num_gpus for t in hosts)
    nodes = [types[cfg["head_node_type"]]["resources"]]
    for name, t in types.items():
        if name != cfg["head_node_type"]:
            nodes += [t["resources"]] * t["max_workers"]
    for stage in STAGES:
        left = unplaced(job_actors(rayjob_config(stage).cluster), nodes)
        assert not left, f"{stage}: {left} do not fit deploy/aws-gpu.yaml at max_workers"
    assert "Dockerfile.gpu" in (ROOT / "deploy" / "aws-gpu.yaml").read_text() and cfg["docker"]["image"]
    assert "--gpus all" in cfg["docker"]["worker_run_options"]


# ----------------------------------------------------------------------------------------- KubeRay

def rayjob_config(stage: str):
    """The stage config the RayJob's entrypoint makes, loaded as the stage job loads it."""
    argv = shlex.split(load(RAYJOBS[stage])["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", f"jobs.{dict(zip(STAGES, JOB_MODULES))[stage]}"], argv
    assert argv[3] == "--config" and argv[4].startswith(IMAGE_ROOT + "/")
    config = ROOT / argv[4][len(IMAGE_ROOT) + 1:]
    assert config.is_file(), config
    return load_stage_config(config, [f"stage={stage}", *argv[5:]])


JOB_MODULES = ("stage1_reasoning_sft", "stage2_tooluse_sft", "stage3_reasoning_rl", "stage4_agentic_rl")


def group_nodes(cluster: dict) -> tuple[list[dict], list[dict]]:
    """Ray resources of the head and of every worker pod at maxReplicas, from rayStartParams."""
    def resources(params: dict) -> dict:
        assert all(isinstance(v, str) for v in params.values()), params  # KubeRay: map[string]string
        out = {"CPU": float(params["num-cpus"]), "GPU": float(params.get("num-gpus", "0"))}
        if "resources" in params:
            out.update(json.loads(json.loads(params["resources"])))  # '"{\"name\": n}"'
        return out
    head = [resources(cluster["headGroupSpec"]["rayStartParams"])]
    workers = [resources(g["rayStartParams"]) for g in cluster["workerGroupSpecs"] for _ in range(g["maxReplicas"])]
    return head, workers


def check_kuberay_cluster(cluster: dict, where: str) -> None:
    """The fields KubeRay's CRD requires and its webhook checks, for one RayCluster spec."""
    version = tuple(int(x) for x in cluster["rayVersion"].split("."))
    assert cluster["rayVersion"] == locked_ray(), where
    assert cluster["authOptions"] == {"mode": "token"} and version >= (2, 52), where  # token auth needs 2.52
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster["workerGroupSpecs"]]
    names = [n for n, _ in groups[1:]]
    assert len(set(names)) == len(names) and all(DNS_1035.fullmatch(n) for n in names), names
    images = set()
    for name, group in groups:
        spec = group["template"]["spec"]
        containers = spec["containers"]
        assert containers and all(c.get("name") and c.get("image") for c in containers), (where, name)
        images |= {c["image"] for c in containers}
        params = group.get("rayStartParams", {})
        assert "labels" not in params and not group.get("resources"), (where, name)  # the webhook's rules
        limits = containers[0]["resources"]["limits"]
        assert str(limits.get("nvidia.com/gpu", 0)) == params.get("num-gpus", "0"), (where, name)
        assert float(params["num-cpus"]) <= float(str(limits["cpu"])), (where, name)
        volumes = {v["name"] for v in spec.get("volumes", [])}
        assert {m["name"] for c in containers for m in c.get("volumeMounts", [])} <= volumes, (where, name)
        if name != "head":
            for key in ("groupName", "minReplicas", "maxReplicas", "template"):
                assert key in group, (where, name, key)
            assert 0 <= group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]
    assert len(images) == 1, f"{where}: one image for every pod (deploy/Dockerfile.gpu), got {images}"


@pytest.mark.parametrize("stage", STAGES)
def test_rayjob_manifest(stage):
    doc = load(RAYJOBS[stage])
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    name = doc["metadata"]["name"]
    assert DNS_1035.fullmatch(name) and len(name) <= 47  # KubeRay: MaxRayJobNameLength
    spec = doc["spec"]
    assert spec["entrypoint"] and spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] >= 0
    check_kuberay_cluster(spec["rayClusterSpec"], f"rayjob-{stage}")
    cfg = rayjob_config(stage)
    assert cfg.cluster.ray and cfg.cluster.placement == "gpu" and cfg.rollout.backend == "vllm"
    assert cfg.run_dir.startswith("/data/")  # on the shared volume
    claims = {v["persistentVolumeClaim"]["claimName"] for g in [spec["rayClusterSpec"]["headGroupSpec"],
                                                                 *spec["rayClusterSpec"]["workerGroupSpecs"]]
              for v in g["template"]["spec"].get("volumes", []) if "persistentVolumeClaim" in v}
    assert claims == {load("deploy/k8s/pvc.yaml")["metadata"]["name"]}
    head, workers = group_nodes(spec["rayClusterSpec"])
    left = unplaced(job_actors(cfg.cluster), head + workers)
    assert not left, f"{stage}: {left} do not fit the RayJob's groups"
    gpu_actors = [a for a in job_actors(cfg.cluster) if a[1].num_gpus]
    assert len(unplaced(gpu_actors, head)) == len(gpu_actors)  # a CPU head: the GPU actors need the workers


def test_rayservice_manifest():
    doc = load(RAYSERVICE)
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayService"
    assert DNS_1035.fullmatch(doc["metadata"]["name"]) and len(doc["metadata"]["name"]) <= 47
    check_kuberay_cluster(doc["spec"]["rayClusterConfig"], "rayservice")
    apps = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
    assert [a["import_path"] for a in apps] == ["serve.app:build_app"]
    from serve.config import load_serve_config
    load_serve_config(apps[0]["args"])  # the app's own validation of its args
    _, workers = group_nodes(doc["spec"]["rayClusterConfig"])
    serve = load_profile("gpu").serve
    replicas = [("serve", serve)] * len(workers)
    assert not unplaced(replicas, workers), "the serve-gpu group cannot hold one replica per pod"


def test_pvc_is_read_write_many():
    doc = load("deploy/k8s/pvc.yaml")
    assert doc["kind"] == "PersistentVolumeClaim" and doc["spec"]["accessModes"] == ["ReadWriteMany"]


# ------------------------------------------------------------------------------- placement source

def test_pool_shards_match_the_runtime_layout():
    from actors.db_pool import DBPoolConfig

    for workers in (1, 2, 5):
        cfg = DBPoolConfig(rollout_workers=workers, per_worker={"sqlite": 1}, reward={"sqlite": 1}, in_process=True)
        assert len(cfg.plan().shards()) == pool_shards(workers)


def test_runtime_hands_each_actor_its_ask(monkeypatch):
    """jobs/runtime.py passes deploy/placement.yaml's asks to every kind of actor (recorded, no Ray)."""
    import ray

    import actors.db_pool
    import actors.learner
    import actors.reward
    import actors.rollout
    import jobs.runtime as runtime

    seen: dict = {}

    class Recorder:
        def __init__(self, kind):
            self.kind = kind

        def __call__(self, *args, **kwargs):
            seen[self.kind] = (args, kwargs)
            return SimpleNamespace(client=lambda **kw: None, shutdown=lambda: None, with_loop=lambda loop: None)

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    for module, name in ((actors.db_pool, "DBPoolGroup"), (actors.reward, "RewardGroup"),
                         (actors.rollout, "RolloutGroup"), (actors.learner, "LearnerGroup")):
        monkeypatch.setattr(module, name, Recorder(name))
    cfg = load_stage_config(None, ["stage=stage4", "cluster.ray=true", "cluster.placement=gpu",
                                   "cluster.learner_num_cpus=6"])
    data = runtime.StageData(train=(), eval=(), catalog={"shop": {"sqlite": "sqlite:///x.sqlite"}}, schemas={},
                             source="fake")
    rt = runtime.Runtime(cfg, data)
    rt.rollout_group("tiny", "agentic", temperature=1.0)
    rt.learner("tiny", None)
    gpu = load_profile("gpu")
    pool = seen["DBPoolGroup"][0][0]
    assert (pool.num_cpus_per_shard, dict(pool.resources)) == (gpu.db_shard.num_cpus, dict(gpu.db_shard.resources))
    reward = seen["RewardGroup"][0][1]
    assert reward.num_cpus_per_actor == gpu.reward.num_cpus and reward.n_actors == 1
    rollout = seen["RolloutGroup"][0][0]
    assert (rollout.num_cpus, rollout.num_gpus, dict(rollout.resources)) == (
        gpu.rollout.num_cpus, gpu.rollout.num_gpus, dict(gpu.rollout.resources))
    learner = seen["LearnerGroup"][1]
    assert (learner["num_cpus"], learner["num_gpus"], learner["resources"]) == (6.0, 1.0, {"sqlrl_learner": 1.0})


def test_default_placement_is_what_the_jobs_asked_for_before():
    cpu = load_stage_config(None, []).cluster.asks()
    assert (cpu.rollout, cpu.learner) == (ActorAsk(1.0), ActorAsk(1.0))
    assert (cpu.reward.num_cpus, cpu.db_shard.num_cpus) == (0.25, 0.25)  # RewardGroupConfig / DBPoolConfig
    assert not any(cpu.ask(k).num_gpus or cpu.ask(k).resources for k in ("rollout", "learner", "reward", "db_shard"))


@pytest.mark.parametrize("body, message", [
    ("profiles: {x: {rollout: {}, learner: {}, reward: {}, db_shard: {}}}", "missing kinds ['serve']"),
    ("profiles: {x: {rollout: {}, learner: {}, reward: {num_gpus: 1}, db_shard: {}, serve: {}}}",
     "reward actor never uses a GPU"),
    ("profiles: {x: {rollout: {num_cpus: -1}, learner: {}, reward: {}, db_shard: {}, serve: {}}}",
     "rollout.num_cpus must be a number >= 0"),
    ("profiles: {x: {rollout: {cpus: 1}, learner: {}, reward: {}, db_shard: {}, serve: {}}}", "keys among"),
    ("profiles: {x: {rollout: {resources: {GPU: 1}}, learner: {}, reward: {}, db_shard: {}, serve: {}}}",
     "not a custom resource name"),
    ("[1, 2]", "must hold one mapping"),
])
def test_bad_placement_file_names_the_key(tmp_path, body, message):
    path = tmp_path / "placement.yaml"
    path.write_text(body)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_profile("x", path)


def test_unknown_profile_is_a_config_error():
    from sqlrl.config import ConfigError

    with pytest.raises(ConfigError, match="unknown placement profile 'tpu'.*cpu, gpu"):
        load_stage_config(None, ["cluster.placement=tpu"])


def test_unplaced_reports_what_does_not_fit():
    gpu = ActorAsk(4, 1, {"sqlrl_rollout": 1})
    assert unplaced([("rollout", gpu)] * 2, [{"CPU": 8, "GPU": 1, "sqlrl_rollout": 1}] * 2) == []
    assert unplaced([("rollout", gpu)] * 2, [{"CPU": 8, "GPU": 2, "sqlrl_rollout": 1}]) == [("rollout", gpu)]
    assert unplaced([("rollout", gpu)], [{"CPU": 8, "GPU": 1}]) == [("rollout", gpu)]  # no custom resource


def test_setup_gpu_refuses_a_wrong_python(tmp_path):
    fake = tmp_path / "python3.10"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'Python 3.10.12'\nexit 1\n")
    fake.chmod(0o755)
    for python, message in ((str(tmp_path / "missing"), "no '"), (str(fake), "Python 3.10.12; locks/gpu.txt is")):
        p = subprocess.run(["bash", "scripts/setup_gpu.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "PYTHON": python, "SQLRL_VENV": str(tmp_path / "venv")})
        assert p.returncode == 1 and message in p.stderr, p.stderr
        assert not (tmp_path / "venv").exists()  # nothing installed


def test_the_image_imports_the_app_folders_from_its_checkout():
    """Only the sqlrl library is installed (pyproject.toml): the image's jobs, actors and Serve
    replicas import actors/curriculum/jobs/serve from the checkout, which must be on PYTHONPATH."""
    text = (ROOT / "deploy" / "Dockerfile.gpu").read_text()
    assert f"COPY . {IMAGE_ROOT}" in text and f"PYTHONPATH={IMAGE_ROOT}" in text

"""A small, seeded, realistic SQLite database ("shop") that sqlrl ships as embedded default data.

Guarantees: the same ``seed`` gives a byte-for-byte identical database; it has foreign keys, NULLs,
ISO dates, free text, duplicate values and a view, so it exercises what real benchmark databases
do. The synthetic task engine (tasks issue) builds more domains on the same pattern.
"""

from __future__ import annotations

import os
import random
import sqlite3
from datetime import date, timedelta

_FIRST = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Niklaus", "Radia",
          "Tim", "Margaret", "John", "Leslie", "Shafi", "Judea", "Yann", "Fei-Fei", "Andrew", "Daphne"]
_LAST = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Wirth",
         "Perlman", "Berners-Lee", "Hamilton", "McCarthy", "Lamport", "Goldwasser", "Pearl"]
_CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Quebec", "Dakar", "Tartu", None]
_CATEGORIES = ["books", "games", "garden", "kitchen", "music", "outdoor", "toys"]
_ADJ = ["compact", "deluxe", "eco", "classic", "smart", "vintage", "portable"]
_NOUN = ["lamp", "kettle", "novel", "puzzle", "speaker", "tent", "planter", "chess set", "drone"]
_STATUS = ["shipped", "delivered", "cancelled", "pending", "delivered", "delivered"]

SCHEMA = """
CREATE TABLE customers (
    customer_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT,
    city TEXT,
    joined DATE NOT NULL
);
CREATE TABLE products (
    product_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    price REAL NOT NULL,
    stock INTEGER
);
CREATE TABLE orders (
    order_id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(customer_id),
    order_date DATE NOT NULL,
    status TEXT NOT NULL
);
CREATE TABLE order_items (
    order_id INTEGER NOT NULL REFERENCES orders(order_id),
    product_id INTEGER NOT NULL REFERENCES products(product_id),
    quantity INTEGER NOT NULL,
    unit_price REAL NOT NULL,
    PRIMARY KEY (order_id, product_id)
);
CREATE VIEW delivered_orders AS SELECT * FROM orders WHERE status = 'delivered';
"""


def build_demo_database(path: str, seed: int = 0, customers: int = 60, products: int = 40,
                        orders: int = 300) -> str:
    """Write the shop database to ``path`` (replacing it) and return ``path``."""
    rng = random.Random(seed)
    if os.path.exists(path):
        os.remove(path)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(SCHEMA)
        start = date(2021, 1, 1)
        for cid in range(1, customers + 1):
            first, last = rng.choice(_FIRST), rng.choice(_LAST)
            email = None if rng.random() < 0.15 else f"{first.lower()}.{last.lower()}{cid}@example.org"
            joined = start + timedelta(days=rng.randrange(0, 700))
            conn.execute("INSERT INTO customers VALUES (?,?,?,?,?)",
                         (cid, f"{first} {last}", email, rng.choice(_CITIES), joined.isoformat()))
        for pid in range(1, products + 1):
            name = f"{rng.choice(_ADJ)} {rng.choice(_NOUN)}"
            stock = None if rng.random() < 0.1 else rng.randrange(0, 200)
            conn.execute("INSERT INTO products VALUES (?,?,?,?,?)",
                         (pid, name, rng.choice(_CATEGORIES), round(rng.uniform(2, 250), 2), stock))
        for oid in range(1, orders + 1):
            day = start + timedelta(days=rng.randrange(0, 1000))
            conn.execute("INSERT INTO orders VALUES (?,?,?,?)",
                         (oid, rng.randrange(1, customers + 1), day.isoformat(), rng.choice(_STATUS)))
            for pid in rng.sample(range(1, products + 1), rng.randrange(1, 5)):
                price = conn.execute("SELECT price FROM products WHERE product_id=?", (pid,)).fetchone()[0]
                conn.execute("INSERT INTO order_items VALUES (?,?,?,?)",
                             (oid, pid, rng.randrange(1, 6), price))
        conn.commit()
    finally:
        conn.close()
    return path

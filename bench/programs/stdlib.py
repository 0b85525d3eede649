"""A standard-library-heavy Python program for `bench/record-programs`:
JSON, regular expressions, collections, decimal arithmetic, difflib,
zlib and heapq over about 100 MB of objects, deterministic (seeded)."""
import collections
import decimal
import difflib
import heapq
import json
import random
import re
import zlib

rng = random.Random(42)
words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 9))) for _ in range(5000)]
records = [
    {"id": i, "name": rng.choice(words), "tags": rng.sample(words, 5), "score": rng.random()}
    for i in range(200_000)
]
text = json.dumps(records)
back = json.loads(text)
counts = collections.Counter(w for r in back for w in r["tags"])
pattern = re.compile(r'"name": "([a-e]+)"')
names = pattern.findall(text)
decimal.getcontext().prec = 50
total = sum((decimal.Decimal(r["score"]) for r in back[:50_000]), decimal.Decimal(0))
top = heapq.nlargest(100, back, key=lambda r: r["score"])
packed = zlib.compress(text.encode(), 6)
diff = list(difflib.unified_diff(words[:2000], sorted(words[:2000]), lineterm=""))
print(len(text), len(counts), len(names), str(total)[:12], top[0]["id"], len(packed), len(diff))

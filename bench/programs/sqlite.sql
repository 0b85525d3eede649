-- 1 M rows inserted, indexed and queried, for `bench/record-programs`.
CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER, v TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000)
INSERT INTO t SELECT i, (i * 7919) % 100003, printf('value-%08d', i) FROM n;
CREATE INDEX t_k ON t (k);
SELECT count(*), sum(k), max(v) FROM t;
SELECT k, count(*) FROM t GROUP BY k ORDER BY count(*) DESC, k LIMIT 5;
SELECT count(*) FROM t a JOIN t b ON a.k = b.id WHERE b.k < 5000;

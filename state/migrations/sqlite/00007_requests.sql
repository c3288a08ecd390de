-- Writes the API took, by the Idempotency-Key their client sent (issue 46 §2): a `serve up`
-- or `serve update` retried through a failover (its answer lost with the leader that
-- wrote it) finds its version here and is answered as the first time, not stored twice.
-- Written in the version's own transaction; rows older than a day are dropped.

-- +goose Up
CREATE TABLE IF NOT EXISTS requests (
	id          TEXT PRIMARY KEY,
	service     TEXT NOT NULL,
	version     INTEGER NOT NULL,
	created_at  INTEGER NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS requests;

-- The schema as Arbiter created it by hand before migrations were versioned: IF NOT EXISTS
-- keeps this a no-op on a state file written by such a version (00002 then adds what that
-- file lacks).

-- +goose Up
CREATE TABLE IF NOT EXISTS services (
	name        TEXT PRIMARY KEY,
	version     INTEGER NOT NULL,
	status      TEXT NOT NULL,
	next_seq    INTEGER NOT NULL DEFAULT 1,
	tokens      REAL NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS versions (
	service     TEXT NOT NULL,
	version     INTEGER NOT NULL,
	spec        TEXT NOT NULL,
	envs        TEXT NOT NULL DEFAULT '{}',
	setup_done  INTEGER NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (service, version)
);
CREATE TABLE IF NOT EXISTS replicas (
	id             TEXT PRIMARY KEY,
	service        TEXT NOT NULL,
	version        INTEGER NOT NULL,
	provider       TEXT NOT NULL,
	handle         TEXT NOT NULL DEFAULT '',
	address        TEXT NOT NULL DEFAULT '',
	model          TEXT NOT NULL DEFAULT '',
	state          TEXT NOT NULL,
	reason         TEXT NOT NULL DEFAULT '',
	capacity       TEXT NOT NULL DEFAULT '',
	region         TEXT NOT NULL DEFAULT '',
	zone           TEXT NOT NULL DEFAULT '',
	price_per_hour REAL NOT NULL DEFAULT 0,
	launched_at    INTEGER NOT NULL,
	ready_at       INTEGER NOT NULL DEFAULT 0,
	updated_at     INTEGER NOT NULL,
	ended_at       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS replicas_by_service ON replicas (service, state);
CREATE TABLE IF NOT EXISTS events (
	id       INTEGER PRIMARY KEY AUTOINCREMENT,
	at       INTEGER NOT NULL,
	service  TEXT NOT NULL,
	replica  TEXT NOT NULL DEFAULT '',
	kind     TEXT NOT NULL,
	message  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_service ON events (service, id);

-- +goose Down
DROP TABLE events;
DROP TABLE replicas;
DROP TABLE versions;
DROP TABLE services;

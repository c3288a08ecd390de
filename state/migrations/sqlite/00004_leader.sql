-- The lease that several control planes sharing one database hold in turn (issue 41 §2):
-- one row. term counts leaders; every write a leader makes checks, in its own transaction,
-- that the term it holds is still this one (lease.go). expires_at is Unix milliseconds.
-- IF NOT EXISTS, as in 00001: a file whose goose versions were rolled back keeps its table.

-- +goose Up
CREATE TABLE IF NOT EXISTS leader (
	id          INTEGER PRIMARY KEY CHECK (id = 1),
	holder      TEXT NOT NULL DEFAULT '',
	term        INTEGER NOT NULL DEFAULT 0,
	expires_at  INTEGER NOT NULL DEFAULT 0
);
INSERT OR IGNORE INTO leader (id) VALUES (1);

-- +goose Down
DROP TABLE IF EXISTS leader;

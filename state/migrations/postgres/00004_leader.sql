-- The lease that several control planes sharing one database hold in turn (issue 41 §2):
-- one row. term counts leaders; every write a leader makes checks, in its own transaction,
-- that the term it holds is still this one (lease.go). expires_at is Unix milliseconds.

-- +goose Up
CREATE TABLE leader (
	id          INTEGER PRIMARY KEY CHECK (id = 1),
	holder      TEXT NOT NULL DEFAULT '',
	term        BIGINT NOT NULL DEFAULT 0,
	expires_at  BIGINT NOT NULL DEFAULT 0
);
INSERT INTO leader (id) VALUES (1);

-- +goose Down
DROP TABLE leader;

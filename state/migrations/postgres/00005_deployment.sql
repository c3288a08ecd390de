-- What belongs to the deployment rather than to any one control plane on it (issue 41 §2):
-- the owner tags its replicas carry (owner.go). Every control plane sharing the database
-- reads them here, so a leader adopts every replica an earlier leader launched, whatever
-- its own home directory.

-- +goose Up
CREATE TABLE deployment (
	key    TEXT PRIMARY KEY,
	value  TEXT NOT NULL
);

-- +goose Down
DROP TABLE deployment;

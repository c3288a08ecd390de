-- Where the control plane that launched a replica answers (its advertised API URL; '' for a
-- control plane without a lease): a replica's output kept on that control plane's host
-- (the local provider's log files) is read through it from any other (issue 46 §4).
-- SQLite's is a Go migration (migrate.go), as 00006's.

-- +goose Up
ALTER TABLE replicas ADD COLUMN IF NOT EXISTS launcher TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE replicas DROP COLUMN launcher;

-- The LoRA adapter a replica serves merged into its weights, as a replica of that adapter's
-- own (issue 51); '' for one of the service's shared replicas, which serve the base model
-- and load adapters. SQLite's is a Go migration (migrate.go), as 00008's.

-- +goose Up
ALTER TABLE replicas ADD COLUMN IF NOT EXISTS adapter TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE replicas DROP COLUMN adapter;

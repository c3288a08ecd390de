-- The GPU a replica was placed on (as the price catalogs name it), which routers predict it
-- with (issue 36 §3).

-- +goose Up
ALTER TABLE replicas ADD COLUMN IF NOT EXISTS accelerator TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE replicas DROP COLUMN accelerator;

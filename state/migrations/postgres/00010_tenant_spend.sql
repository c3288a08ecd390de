-- What each tenant spent per UTC day (issue 52): dollars at the replicas' price per token,
-- tokens and requests, as the routers reported them, added at each tick. Budgets read the
-- day's and the month's sums, so a router or control-plane restart loses no spend, and
-- every router of the deployment reads the same figures.

-- +goose Up
CREATE TABLE IF NOT EXISTS tenant_spend (
	tenant    TEXT NOT NULL,
	day       TEXT NOT NULL,
	dollars   DOUBLE PRECISION NOT NULL DEFAULT 0,
	tokens    DOUBLE PRECISION NOT NULL DEFAULT 0,
	requests  DOUBLE PRECISION NOT NULL DEFAULT 0,
	PRIMARY KEY (tenant, day)
);

-- +goose Down
DROP TABLE IF EXISTS tenant_spend;

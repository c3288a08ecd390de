-- What each LoRA adapter of a service served (issue 51): requests and tokens as the routers
-- reported them, added at each tick, so `serve status`'s chargeback per fine-tune survives a
-- control-plane restart as the service's own token count does.

-- +goose Up
CREATE TABLE IF NOT EXISTS adapter_use (
	service   TEXT NOT NULL,
	adapter   TEXT NOT NULL,
	requests  DOUBLE PRECISION NOT NULL DEFAULT 0,
	tokens    DOUBLE PRECISION NOT NULL DEFAULT 0,
	since     BIGINT NOT NULL,
	PRIMARY KEY (service, adapter)
);

-- +goose Down
DROP TABLE IF EXISTS adapter_use;

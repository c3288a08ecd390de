package spec

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// minimal is the smallest valid file; cases append to it or replace it.
const minimal = "run: echo hi\nservice:\n  readiness_probe: /health\n"

func mustParse(t *testing.T, src string) *Service {
	t.Helper()
	s, err := Parse("svc.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror:\n%v", src, err)
	}
	return s
}

func parseErrors(t *testing.T, src string) ErrorList {
	t.Helper()
	s, err := Parse("svc.yaml", []byte(src))
	if err == nil {
		t.Fatalf("Parse accepted:\n%s\ngot %+v", src, s)
	}
	var list *ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("error is %T, want *ErrorList: %v", err, err)
	}
	return *list
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name      string
		src       string
		line, col int
		msg       string
	}{
		{"empty file", "", 0, 0, "file is empty"},
		{"only comments", "# nothing\n", 0, 0, "file is empty"},
		{"null document", "~\n", 1, 1, "document is empty"},
		{"list document", "- run: x\n", 1, 1, "want a mapping of keys such as service:"},
		{"syntax error", "run: echo\nservice: [a\n", 2, 0, "invalid YAML"},
		{"tab indentation", "run: echo\nservice:\n\treplicas: 1\n", 3, 0, "invalid YAML"},
		{"two documents", minimal + "---\nrun: again\n", 4, 1, "second YAML document"},
		{"alias", "x: &cmd echo\nrun: *cmd\nservice: {}\n", 2, 6, "anchors and aliases (*cmd) are not supported"},
		{"merge key alias", "base: &b {replicas: 1}\nrun: x\nservice:\n  <<: *b\n", 4, 7, "anchors and aliases"},

		{"unknown top key with suggestion", minimal + "servce: {}\n", 4, 1, `unknown key "servce" at the top level; did you mean "service"?`},
		{"unknown key case", minimal + "Setup: x\n", 4, 1, `did you mean "setup"?`},
		{"unknown service key", "run: x\nservice:\n  replica_polcy: {min_replicas: 1}\n", 3, 3, `unknown key "replica_polcy" in service; did you mean "replica_policy"?`},
		{"unknown key far from all", "run: x\nservice:\n  colour: blue\n", 3, 3, `unknown key "colour" in service; allowed: readiness_probe, replicas`},
		{"transposition", "run: x\nservice:\n  replica_policy: {min_replicas: 1, max_repilcas: 2}\n", 3, 37, `did you mean "max_replicas"?`},
		{"duplicate key", "run: x\nrun: y\nservice: {}\n", 2, 1, `"run" is given twice (first at line 1)`},

		{"no service", "run: x\n", 1, 1, "this file has no service: section; add one, e.g. service: {readiness_probe: /health, replicas: 1}"},
		{"null service", "run: x\nservice:\n", 2, 1, "this file has no service: section"},
		{"no run", "service: {}\n", 1, 1, "run: missing"},
		{"blank run", "run: '  '\nservice: {}\n", 1, 6, "run: is empty"},
		{"service not a mapping", "run: x\nservice: [a]\n", 2, 10, "service: want a mapping of readiness_probe, replicas"},
		{"name", minimal + "name: my/service\n", 4, 7, `name: "my/service" is not a valid service name`},
		{"env null", minimal + "envs:\n  MODEL: m\n  HF_TOKEN:\n", 6, 12, "envs.HF_TOKEN: no value; give one here or with --env HF_TOKEN=…"},
		{"env explicit null", minimal + "envs: {HF_TOKEN: null}\n", 4, 18, "envs.HF_TOKEN: no value"},
		{"secret null", minimal + "secrets: {HF_TOKEN: ~}\n", 4, 21, "secrets.HF_TOKEN: no value; give one here or with --secret HF_TOKEN=…"},
		{"env name", minimal + "envs: {1X: a}\n", 4, 8, `envs: "1X" is not a variable name`},
		{"env list value", minimal + "envs: {X: [a]}\n", 4, 11, "envs.X: want a string, got a list"},

		{"min_replicas word", "run: x\nservice:\n  replica_policy:\n    min_replicas: two\n", 4, 19, `service.replica_policy.min_replicas: want an integer from 0 to 1000, got "two"`},
		{"min_replicas negative", "run: x\nservice:\n  replica_policy: {min_replicas: -1}\n", 3, 34, "want an integer from 0 to 1000, got -1"},
		{"min_replicas float", "run: x\nservice:\n  replica_policy: {min_replicas: 1.5}\n", 3, 34, "want an integer from 0 to 1000, got 1.5"},
		{"a billion replicas", "run: x\nservice:\n  replica_policy: {min_replicas: 1000000000, max_replicas: 1000000000}\n", 3, 34, "min_replicas: want an integer from 0 to 1000, got 1000000000"},
		{"a billion fixed replicas", "run: x\nservice:\n  replicas: 1000000000\n", 3, 13, "service.replicas: want an integer from 0 to 1000, got 1000000000"},
		{"replicas and replica_policy", "run: x\nservice:\n  replicas: 2\n  replica_policy: {min_replicas: 1}\n", 4, 3, "give replicas (a fixed size) or replica_policy (autoscaling), not both"},
		{"min_replicas missing", "run: x\nservice:\n  replica_policy:\n    max_replicas: 3\n", 3, 3, "service.replica_policy: min_replicas is required"},
		{"no replica ever", "run: x\nservice:\n  replicas: 0\n", 3, 13, "service.replicas: must be ≥ 1"},
		{"scale to zero without max", "run: x\nservice:\n  replica_policy: {min_replicas: 0}\n", 3, 19, "max_replicas: must be ≥ 1 (it defaults to min_replicas, 0)"},
		{"max below min", "run: x\nservice:\n  replica_policy: {min_replicas: 3, max_replicas: 2, target_qps_per_replica: 1}\n", 3, 51, "max_replicas: must be ≥ min_replicas (3), got 2"},
		{"max above min without target", "run: x\nservice:\n  replica_policy: {min_replicas: 1, max_replicas: 2}\n", 3, 51, "must equal min_replicas (1) unless target_qps_per_replica is set, or arbiter.autoscaling.signal is concurrency"},
		{"target qps zero", "run: x\nservice:\n  replica_policy: {min_replicas: 1, target_qps_per_replica: 0}\n", 3, 61, "want a number > 0, or a mapping of accelerator to number, got 0"},
		{"delay infinite", "run: x\nservice:\n  replica_policy: {min_replicas: 1, upscale_delay_seconds: .inf}\n", 3, 60, "want a number of seconds ≥ 0, got .inf"},
		{"spot knob without spot", "run: x\nservice:\n  replica_policy: {min_replicas: 1, base_ondemand_fallback_replicas: 1}\n", 3, 70, "base_ondemand_fallback_replicas: needs resources.use_spot: true"},
		{"dynamic fallback without spot", "run: x\nresources: {use_spot: false}\nservice:\n  replica_policy: {min_replicas: 1, dynamic_ondemand_fallback: true}\n", 4, 64, "dynamic_ondemand_fallback: needs resources.use_spot"},
		{"spot placer value", "run: x\nresources: {use_spot: true}\nservice:\n  replica_policy: {min_replicas: 1, spot_placer: dynamic_fallbak}\n", 4, 50, `want one of dynamic_fallback, got "dynamic_fallbak"; did you mean "dynamic_fallback"?`},
		{"spot placer without spot", "run: x\nservice:\n  replica_policy: {min_replicas: 1, spot_placer: dynamic_fallback}\n", 3, 50, "spot_placer: needs resources.use_spot"},
		{"qps map without policy", "run: x\nservice:\n  replica_policy: {min_replicas: 1, max_replicas: 2, target_qps_per_replica: {A100: 5}}\n", 3, 78, "the per-accelerator form needs service.load_balancing_policy: instance_aware_least_load"},
		{"instance aware without map", "run: x\nservice:\n  load_balancing_policy: instance_aware_least_load\n", 3, 26, "instance_aware_least_load needs target_qps_per_replica as a mapping"},
		{"qps map bad accelerator", "run: x\nservice:\n  load_balancing_policy: instance_aware_least_load\n  replica_policy: {min_replicas: 1, target_qps_per_replica: {\"A100:x\": 5}}\n", 4, 62, "want a whole number of accelerators"},
		{"load balancing typo", "run: x\nservice:\n  load_balancing_policy: least_laod\n", 3, 26, `want one of round_robin, least_load, instance_aware_least_load, got "least_laod"; did you mean "least_load"?`},
		{"service port range", "run: x\nservice:\n  ports: 70000\n", 3, 10, "service.ports: want a port number from 1 to 65535, got 70000"},

		{"probe path", "run: x\nservice:\n  readiness_probe: health\n", 3, 20, "the path must start with /, e.g. /health"},
		{"probe block path", "run: x\nservice:\n  readiness_probe:\n    path: v1/models\n", 4, 11, "must start with /"},
		{"probe no path", "run: x\nservice:\n  readiness_probe:\n    timeout_seconds: 5\n", 3, 3, "path is required in the block form"},
		{"probe timeout", "run: x\nservice:\n  readiness_probe: {path: /, timeout_seconds: 0}\n", 3, 47, "timeout_seconds: want a number of seconds > 0, got 0"},
		{"probe post_data not JSON", "run: x\nservice:\n  readiness_probe:\n    path: /\n    post_data: '{model: x'\n", 5, 16, "this string is not JSON"},
		{"probe post_data list", "run: x\nservice:\n  readiness_probe:\n    path: /\n    post_data: [1]\n", 5, 16, "want a mapping or a JSON string, got a list"},
		{"probe header name", "run: x\nservice:\n  readiness_probe:\n    path: /\n    headers: {\"bad name\": x}\n", 5, 15, `"bad name" is not a valid HTTP header name`},

		{"sim prices_at", minimal + "arbiter:\n  providers: [sim]\n  sim: {prices_at: August}\n", 6, 20, "arbiter.sim.prices_at: want a date such as 2026-08-01"},
		{"sim speedup", minimal + "arbiter:\n  sim: {speedup: 0}\n", 5, 18, "arbiter.sim.speedup: want a number > 0 of trace seconds"},
		{"sim unknown key", minimal + "arbiter:\n  sim: {spot_trce: x}\n", 5, 9, `did you mean "spot_trace"?`},
		{"resources not a mapping", minimal + "resources: A100\n", 4, 12, "resources: want a mapping of infra, cloud"},
		{"unknown resources key", minimal + "resources: {accelerator: A100}\n", 4, 13, `did you mean "accelerators"?`},
		{"job_recovery", minimal + "resources:\n  job_recovery: FAILOVER\n", 5, 3, "resources.job_recovery: remove it: job_recovery is for managed jobs"},
		{"infra and cloud", minimal + "resources: {infra: aws, cloud: gcp}\n", 4, 25, "give infra or cloud, not both"},
		{"infra too long", minimal + "resources: {infra: gcp/a/b/c}\n", 4, 20, "resources.infra: want cloud[/region[/zone]]"},
		{"infra empty part", minimal + "resources: {infra: gcp//b}\n", 4, 20, "want cloud[/region[/zone]]"},
		{"accelerator fraction", minimal + "resources: {accelerators: \"A100:0.5\"}\n", 4, 27, "want a whole number of accelerators ≥ 1"},
		{"accelerator fractional 1.5", minimal + "resources: {accelerators: \"A100:1.5\"}\n", 4, 27, "fractional accelerator counts (1.5) are not supported"},
		{"accelerator zero", minimal + "resources: {accelerators: {A100: 0}}\n", 4, 34, "resources.accelerators.A100: want a whole number of accelerators ≥ 1, got \"0\""},
		{"accelerator name", minimal + "resources: {accelerators: \"8\"}\n", 4, 27, `want an accelerator such as A100`},
		{"accelerator twice", minimal + "resources: {accelerators: [A100, V100, A100]}\n", 4, 40, `"A100:1" is listed twice`},
		{"accelerator at one count twice", minimal + "resources: {accelerators: [A100:4, A100:8, a100:4]}\n", 4, 44, `"a100:4" is listed twice`},
		{"accelerators empty", minimal + "resources: {accelerators: []}\n", 4, 27, "want at least one accelerator"},
		{"ports range", minimal + "resources: {ports: \"8090-8080\"}\n", 4, 20, `resources.ports: want a port (8080), a range ("8080-8090") or a list of those from 1 to 65535, got "8090-8080"`},
		{"ports in list", minimal + "resources: {ports: [8080, 0]}\n", 4, 27, "got 0"},
		{"several ports", minimal + "resources: {ports: [8080, 8081]}\n", 4, 20, "resources.ports: opens 8080, 8081; say which port serves with service.ports"},
		{"cpus", minimal + "resources: {cpus: many}\n", 4, 19, "resources.cpus: want a number of CPUs such as 4, or 4+"},
		{"memory zero", minimal + "resources: {memory: 0}\n", 4, 21, "resources.memory: want a size in GB"},
		{"disk tier", minimal + "resources: {disk_tier: fast}\n", 4, 24, "want one of low, medium, high, ultra, best"},
		{"use_spot type", minimal + "resources: {use_spot: sometimes}\n", 4, 23, `resources.use_spot: want true or false, got "sometimes"`},
		{"any_of and ordered", minimal + "resources:\n  any_of: [{cloud: aws}]\n  ordered: [{cloud: gcp}]\n", 6, 3, "give any_of or ordered, not both"},
		{"accelerator list with any_of", minimal + "resources:\n  accelerators: [A100, V100]\n  any_of: [{cloud: aws}]\n", 5, 17, "several accelerators cannot be combined with any_of"},
		{"accelerator map with ordered", minimal + "resources:\n  accelerators: {A100: 1, V100: 1}\n  ordered: [{cloud: aws}]\n", 5, 17, "several accelerators cannot be combined with ordered"},
		{"any_of not a list", minimal + "resources:\n  any_of: {cloud: aws}\n", 5, 11, "resources.any_of: want a list of resource mappings"},
		{"any_of empty", minimal + "resources:\n  any_of: []\n", 5, 11, "want at least one entry"},
		{"any_of nested", minimal + "resources:\n  any_of:\n    - ordered: [{cloud: aws}]\n", 6, 7, "resources.any_of[0].ordered: any_of and ordered cannot be nested"},
		{"any_of unknown key", minimal + "resources:\n  any_of:\n    - {regoin: us-east-1}\n", 6, 8, `unknown key "regoin" in resources.any_of[0]; did you mean "region"?`},
		{"any_of use_spot differs", minimal + "resources:\n  any_of:\n    - {use_spot: true}\n    - {use_spot: false}\n", 7, 8, "every candidate must agree on use_spot"},
		{"any_of infra over cloud", minimal + "resources:\n  cloud: gcp\n  any_of:\n    - {infra: aws}\n", 7, 8, "resources.any_of[0].infra: the base resources give the location the other way"},

		{"arbiter unknown", minimal + "arbiter: {slo_target: 1}\n", 4, 11, `unknown key "slo_target" in arbiter`},
		{"model and models", minimal + "arbiter: {model: a, models: [b]}\n", 4, 21, "give model or models, not both"},
		{"models twice", minimal + "arbiter: {models: [a, a]}\n", 4, 23, `"a" is listed twice`},
		{"provider unknown", minimal + "arbiter: {providers: [local, gke]}\n", 4, 30, `arbiter.providers: want one of local, sim, kubernetes, aws, runpod, got "gke"`},
		{"providers empty", minimal + "arbiter: {providers: []}\n", 4, 22, "want at least one of local"},
		{"kubernetes cluster name", minimal + "arbiter: {providers: [\"kubernetes:gke prod\"]}\n", 4, 23, `after kubernetes: give a cluster name`},
		{"kubernetes secrets", minimal + "secrets: {HF_TOKEN: x}\narbiter: {providers: [kubernetes]}\n", 4, 10, "secrets: the kubernetes provider does not pass secrets yet"},
		{"kubernetes workdir", minimal + "workdir: ./app\narbiter: {providers: [kubernetes:gke]}\n", 4, 10, "workdir: the kubernetes provider cannot sync a local folder into pods"},
		{"kubernetes image", minimal + "resources: {image_id: ami-0123}\narbiter: {providers: [local, kubernetes]}\n", 4, 23, `resources.image_id: "ami-0123": the kubernetes provider runs container images`},
		{"aws secrets", minimal + "secrets: {HF_TOKEN: x}\narbiter: {providers: [aws]}\n", 4, 10, "secrets: the aws provider does not pass secrets yet"},
		// A workdir is fetched by the user data from a presigned URL, which takes its room.
		{"aws script size with workdir", "workdir: ./app\nrun: " + strings.Repeat("x", 14<<10-3<<10+1) + "\nservice:\n  readiness_probe: /health\narbiter: {providers: [aws]}\n", 2, 6, "the aws provider passes them as EC2 user data"},
		{"local beside a market, no slot", minimal + "arbiter: {providers: [local, runpod]}\n", 4, 22, "arbiter.providers: local beside runpod: the local machine quotes no price"},
		{"aws image", minimal + "resources: {image_id: docker:vllm/vllm-openai}\narbiter: {providers: [aws]}\n", 4, 23, `resources.image_id: "docker:vllm/vllm-openai": the aws provider boots AMIs`},
		{"aws script size", "run: " + strings.Repeat("x", 15000) + "\nservice:\n  readiness_probe: /health\narbiter: {providers: [aws]}\n", 1, 6, "the aws provider passes them as EC2 user data, which holds 16 KiB"},
		{"runpod secrets", minimal + "secrets: {HF_TOKEN: x}\narbiter: {providers: [runpod]}\n", 4, 10, "secrets: the runpod provider does not pass secrets yet"},
		{"runpod image", minimal + "resources: {image_id: ami-0123}\narbiter: {providers: [runpod]}\n", 4, 23, `resources.image_id: "ami-0123": the runpod provider runs container images`},
		{"routing policy", minimal + "arbiter: {routing_policy: cheapest}\n", 4, 27, "want one of slo_cheapest, least_load, round_robin"},
		{"profile unknown GPU", minimal + "arbiter: {profile: mi300-llama-3.1-8b}\n", 4, 20, `arbiter.profile: profile "mi300-llama-3.1-8b": unknown GPU "mi300"`},
		{"profile does not fit", minimal + "arbiter: {profile: t4-llama-3.1-70b}\n", 4, 20, "does not fit 8 × t4"},
		{"profile file", minimal + "arbiter: {profile: p.json}\n", 4, 20, "a file is for replicasim only"},
		{"percentile zero", minimal + "arbiter: {slo: {percentile: 0}}\n", 4, 29, "arbiter.slo.percentile: want a percentile such as 90, 99.9 or 0.9, got 0"},
		{"percentile above 100", minimal + "arbiter: {slo: {percentile: 150}}\n", 4, 29, "got 150"},
		{"availability 100", minimal + "resources: {use_spot: true}\narbiter: {availability: 100}\n", 5, 25, "arbiter.availability: want a target below 100 %, such as 99.9 (percent) or 0.999 (leave it out for none), got 100"},
		{"availability 1", minimal + "resources: {use_spot: true}\narbiter: {availability: 1}\n", 5, 25, "got 1"},
		{"availability without spot", minimal + "arbiter: {availability: 99.9}\n", 4, 25, "arbiter.availability: a target for spot purchasing; it needs resources.use_spot: true"},
		{"ttft negative", minimal + "arbiter: {slo: {ttft_seconds: -1}}\n", 4, 31, "want a number of seconds ≥ 0 (0: no target), got -1"},
		{"price ratio", minimal + "arbiter: {spot_policy: {max_price_ratio: 1.5}}\n", 4, 42, "a ratio greater than 0 and at most 1"},
		{"rebalance saving", minimal + "arbiter: {spot_policy: {rebalance_min_saving: 1}}\n", 4, 47, "rebalance_min_saving: want auto (move when it pays for its cold start), or a fraction from 0 (never move) to below 1"},
		{"rebalance word", minimal + "arbiter: {spot_policy: {rebalance_min_saving: always}}\n", 4, 47, "rebalance_min_saving: want auto (move when it pays for its cold start), or a fraction"},
		{"spot zones", minimal + "arbiter: {spot_policy: {min_zones: 0}}\n", 4, 36, "min_zones: want a number of zones from 1 (no hedge, no spread) to 16"},
		{"signal typo", minimal + "arbiter: {autoscaling: {signal: qsp}}\n", 4, 33, `did you mean "qps"?`},
		{"signal qps without target", minimal + "arbiter: {autoscaling: {signal: qps}}\n", 4, 33, "qps needs service.replica_policy.target_qps_per_replica"},
		{"signal tokens without target", minimal + "arbiter: {autoscaling: {signal: tokens_per_second}}\n", 4, 33, "tokens_per_second needs arbiter.autoscaling.target_tokens_per_second_per_replica"},
		{"panic window", minimal + "arbiter: {autoscaling: {panic_window_seconds: 90}}\n", 4, 47, "panic_window_seconds: must be ≤ stable_window_seconds (60), got 90"},
		{"panic threshold", minimal + "arbiter: {autoscaling: {panic_threshold: 0.5}}\n", 4, 42, "want a number ≥ 1"},
		{"failure threshold", minimal + "arbiter: {readiness: {failure_threshold: 0}}\n", 4, 42, "want an integer ≥ 1, got 0"},
		{"local capacity", minimal + "arbiter: {local: {capacity: free}}\n", 4, 29, "want one of reserved, spot, on_demand"},
		{"reserved not a list", minimal + "arbiter: {reserved: {provider: aws}}\n", 4, 21, "arbiter.reserved: want a list"},
		{"reserved missing accelerator", minimal + "arbiter:\n  reserved:\n    - {provider: local}\n", 6, 7, "arbiter.reserved[0]: accelerator is required"},
		{"reserved provider not enabled", minimal + "arbiter:\n  reserved:\n    - {provider: aws, accelerator: \"H100:8\"}\n", 6, 18, "arbiter.reserved[0].provider: aws is not in arbiter.providers (local); add it there"},
		{"reserved count disagrees", minimal + "arbiter:\n  reserved:\n    - {provider: local, accelerator: \"H100:8\", count: 4}\n", 6, 55, "count: 4 disagrees with accelerator"},
		{"nul in run", "run: \"echo \\0\"\nservice: {}\n", 1, 6, "run: contains a NUL character"},
		{"queue under round_robin", minimal + "arbiter: {routing_policy: round_robin, queue: {enabled: true}}\n", 4, 57, "arbiter.queue.enabled: the queue needs routing_policy slo_cheapest"},
		{"queue under a SkyServe balancing policy", "run: echo hi\nservice:\n  readiness_probe: /health\n  load_balancing_policy: least_load\narbiter: {queue: {enabled: true}}\n", 5, 28, "this service routes by least_load"},
		{"queue fill zero", minimal + "arbiter: {queue: {sheddable_fill: 0}}\n", 4, 35, "sheddable_fill: want a share of the SLO greater than 0 and at most 1"},
		{"queue wait", minimal + "arbiter: {queue: {max_wait_seconds: 7200}}\n", 4, 37, "max_wait_seconds: want a number of seconds greater than 0, up to 3600"},
		{"queue enabled not a bool", minimal + "arbiter: {queue: {enabled: maybe}}\n", 4, 28, "arbiter.queue.enabled: want true or false"},
		{"queue unknown key", minimal + "arbiter: {queue: {max_waiting: 10}}\n", 4, 19, `unknown key "max_waiting" in arbiter.queue`},
		{"engine priority without the flag", "run: vllm serve m --port 8080\nservice:\n  readiness_probe: /health\narbiter: {queue: {engine_priority: true}}\n", 4, 36, "the run: command starts it without --scheduling-policy (vLLM's default, fcfs)"},
		{"engine priority with fcfs", "run: vllm serve m --scheduling-policy=fcfs\nservice:\n  readiness_probe: /health\narbiter: {queue: {engine_priority: true}}\n", 4, 36, "starts it with --scheduling-policy fcfs"},
		{"tenants not a list", minimal + "arbiter: {tenants: {name: a}}\n", 4, 20, "arbiter.tenants: want a list"},
		{"tenant band unknown", minimal + "arbiter: {tenants: [{name: a, priority: urgent}]}\n", 4, 41, "want one of critical, standard, sheddable"},
		{"tenant twice", minimal + "arbiter: {tenants: [{name: a, weight: 2}, {name: a, priority: critical}]}\n", 4, 43, `tenant "a" is listed twice`},
		{"tenant weight", minimal + "arbiter: {tenants: [{name: a, weight: 0}]}\n", 4, 39, "want a share weight greater than 0, up to 1000"},
		{"tenant neither", minimal + "arbiter: {tenants: [{name: a}]}\n", 4, 21, "gives neither priority nor weight"},
		{"tenant unknown key", minimal + "arbiter: {tenants: [{name: a, budget: 5}]}\n", 4, 31, `unknown key "budget" in arbiter.tenants[0]`},
		{"engine priority not a bool", minimal + "arbiter: {queue: {engine_priority: yes please}}\n", 4, 36, "arbiter.queue.engine_priority: want true or false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := parseErrors(t, tt.src)
			for _, e := range errs {
				if e.Line == tt.line && e.Column == tt.col && strings.Contains(e.Msg, tt.msg) {
					if e.File != "svc.yaml" {
						t.Errorf("File = %q, want svc.yaml", e.File)
					}
					return
				}
			}
			t.Errorf("want an error at %d:%d containing %q; got:\n%v", tt.line, tt.col, tt.msg, errs)
		})
	}
}

func TestErrorsAllInFileOrder(t *testing.T) {
	src := `arbiter: {routing_policy: fastest}
service:
  replica_policy: {min_replicas: two}
  readiness_probe: health
resources: {cloudd: aws}
`
	errs := parseErrors(t, src)
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	want := []string{
		"svc.yaml:1:1: run: missing",
		"svc.yaml:1:27: arbiter.routing_policy: want one of",
		"svc.yaml:3:34: service.replica_policy.min_replicas: want an integer",
		"svc.yaml:4:20: service.readiness_probe: the path must start with /",
		"svc.yaml:5:13: unknown key \"cloudd\" in resources",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("error %d = %q, want prefix %q", i, got[i], want[i])
		}
	}
	if s := errs.Error(); strings.Count(s, "\n") != len(want)-1 {
		t.Errorf("ErrorList.Error() should join with newlines:\n%s", s)
	}
}

func TestErrorFormat(t *testing.T) {
	for _, tt := range []struct {
		e    Error
		want string
	}{
		{Error{"a.yaml", 3, 7, "bad"}, "a.yaml:3:7: bad"},
		{Error{"a.yaml", 3, 0, "bad"}, "a.yaml:3: bad"},
		{Error{"a.yaml", 0, 0, "bad"}, "a.yaml: bad"},
		{Error{"", 2, 1, "bad"}, "2:1: bad"},
		{Error{"", 0, 0, "bad"}, "bad"},
	} {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("%+v.Error() = %q, want %q", tt.e, got, tt.want)
		}
	}
}

func TestDefaults(t *testing.T) {
	got := mustParse(t, "run: python serve.py\nservice: {}\n")
	want := &Service{
		NumNodes: 1,
		Run:      "python serve.py",
		Service: ServiceSection{
			ReadinessProbe: ReadinessProbe{Path: "/", InitialDelaySeconds: 1200, TimeoutSeconds: 15},
			ReplicaPolicy: ReplicaPolicy{
				MinReplicas: 1, MaxReplicas: 1,
				UpscaleDelaySeconds: 300, DownscaleDelaySeconds: 1200,
			},
			Fixed:               true,
			LoadBalancingPolicy: "least_load",
		},
		Arbiter: Arbiter{
			RoutingPolicy:           "slo_cheapest",
			SLO:                     SLO{TTFTSeconds: 2, TPOTSeconds: 0.1, Percentile: 0.9},
			SpotPolicy:              SpotPolicy{MaxPriceRatio: 0.6, MinZones: 2, RebalanceWhenItPays: true},
			Queue:                   Queue{MaxWaitSeconds: 30, SheddableFill: 1},
			Providers:               []string{"local"},
			ScaleToZeroAfterSeconds: 300,
			Autoscaling: Autoscaling{
				Signal: "concurrency", TargetConcurrencyPerReplica: 8,
				StableWindowSeconds: 60, PanicWindowSeconds: 6, PanicThreshold: 2, MaxScaleUpRate: 4, DecisionIntervalSeconds: 1,
			},
			Readiness: Readiness{ProbeIntervalSeconds: 10, FailureThreshold: 3, ReadyBudgetSeconds: 1500},
			Local:     Local{Capacity: "reserved", Region: "local", Zone: "local"},
			Sim:       Sim{SpotTrace: "skypilot-preemption-aws-04-22-2023-v100_1", Speedup: 60, PricesAt: "2026-08-01"},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", got, want)
	}
}

func TestReplicaForms(t *testing.T) {
	t.Run("fixed", func(t *testing.T) {
		s := mustParse(t, "run: x\nservice: {replicas: 3}\n")
		if p := s.Service.ReplicaPolicy; !s.Service.Fixed || p.MinReplicas != 3 || p.MaxReplicas != 3 {
			t.Errorf("replicas: 3 → Fixed %v, %+v", s.Service.Fixed, p)
		}
	})
	t.Run("max defaults to min", func(t *testing.T) {
		s := mustParse(t, "run: x\nservice: {replica_policy: {min_replicas: 2}}\n")
		if p := s.Service.ReplicaPolicy; s.Service.Fixed || p.MaxReplicas != 2 {
			t.Errorf("got Fixed %v, %+v", s.Service.Fixed, p)
		}
	})
	t.Run("qps autoscaling", func(t *testing.T) {
		s := mustParse(t, "run: x\nservice: {replica_policy: {min_replicas: 1, max_replicas: 4, target_qps_per_replica: 2.5}}\n")
		if s.Service.ReplicaPolicy.TargetQPSPerReplica != 2.5 || s.Arbiter.Autoscaling.Signal != "qps" {
			t.Errorf("got %+v, signal %q", s.Service.ReplicaPolicy, s.Arbiter.Autoscaling.Signal)
		}
	})
	t.Run("explicit concurrency signal lifts max = min", func(t *testing.T) {
		s := mustParse(t, "run: x\nservice: {replica_policy: {min_replicas: 0, max_replicas: 4}}\narbiter: {autoscaling: {signal: concurrency}}\n")
		if s.Service.ReplicaPolicy.MaxReplicas != 4 {
			t.Errorf("got %+v", s.Service.ReplicaPolicy)
		}
	})
	t.Run("per-accelerator qps", func(t *testing.T) {
		s := mustParse(t, "run: x\nservice:\n  load_balancing_policy: Instance_Aware_Least_Load\n  replica_policy: {min_replicas: 1, max_replicas: 3, target_qps_per_replica: {\"A100:1\": 5, L4: 2}}\n")
		want := map[string]float64{"A100:1": 5, "L4": 2}
		if !reflect.DeepEqual(s.Service.ReplicaPolicy.TargetQPSByAccelerator, want) || s.Service.LoadBalancingPolicy != "instance_aware_least_load" {
			t.Errorf("got %+v, %q", s.Service.ReplicaPolicy.TargetQPSByAccelerator, s.Service.LoadBalancingPolicy)
		}
		if s.Arbiter.RoutingPolicy != "least_load" || s.Arbiter.Autoscaling.Signal != "qps" {
			t.Errorf("routing %q, signal %q", s.Arbiter.RoutingPolicy, s.Arbiter.Autoscaling.Signal)
		}
	})
}

func TestRoutingPolicyFromLoadBalancing(t *testing.T) {
	for _, tt := range []struct{ src, want string }{
		{"run: x\nservice: {}\n", "slo_cheapest"},
		{"run: x\nservice: {load_balancing_policy: ROUND_ROBIN}\n", "round_robin"},
		{"run: x\nservice: {load_balancing_policy: least_load}\n", "least_load"},
		{"run: x\nservice: {load_balancing_policy: round_robin}\narbiter: {routing_policy: slo_cheapest}\n", "slo_cheapest"},
	} {
		if got := mustParse(t, tt.src).Arbiter.RoutingPolicy; got != tt.want {
			t.Errorf("%q: RoutingPolicy = %q, want %q", tt.src, got, tt.want)
		}
	}
}

func TestAcceleratorForms(t *testing.T) {
	for _, tt := range []struct {
		yaml    string
		want    []Accelerator
		ordered bool
	}{
		{`"A100:1"`, []Accelerator{{"A100", 1}}, false},
		{`L4`, []Accelerator{{"L4", 1}}, false},
		{`A100-80GB:8`, []Accelerator{{"A100-80GB", 8}}, false},
		{`"RTX-PRO-6000:2.0"`, []Accelerator{{"RTX-PRO-6000", 2}}, false},
		{`tpu-v5e-8`, []Accelerator{{"tpu-v5e-8", 1}}, false},
		{`{L4: 1, A10G: 2}`, []Accelerator{{"L4", 1}, {"A10G", 2}}, false},
		{`{L4, A10G}`, []Accelerator{{"L4", 1}, {"A10G", 1}}, false},
		{`{L4:1, A10G:2}`, []Accelerator{{"L4", 1}, {"A10G", 2}}, false},
		{`[A100, "V100:4"]`, []Accelerator{{"A100", 1}, {"V100", 4}}, true},
		{`[{H100: 8}, {A100-80GB: 8}]`, []Accelerator{{"H100", 8}, {"A100-80GB", 8}}, true},
	} {
		s := mustParse(t, minimal+"resources: {accelerators: "+tt.yaml+"}\n")
		r := s.Resources
		if !reflect.DeepEqual(r.Accelerators, tt.want) || r.AcceleratorsOrdered != tt.ordered {
			t.Errorf("accelerators: %s → %+v ordered=%v, want %+v ordered=%v", tt.yaml, r.Accelerators, r.AcceleratorsOrdered, tt.want, tt.ordered)
		}
	}
}

func TestInfra(t *testing.T) {
	for _, tt := range []struct {
		infra, cloud, region, zone string
	}{
		{"aws", "aws", "", ""},
		{"AWS", "aws", "", ""},
		{"gcp/us-east1", "gcp", "us-east1", ""},
		{"gcp/*/asia-northeast3-a", "gcp", "", "asia-northeast3-a"},
		{"aws/us-east-1/us-east-1a", "aws", "us-east-1", "us-east-1a"},
		{"k8s/my-ctx", "kubernetes", "my-ctx", ""},
		{"kubernetes/arn:aws:eks:us-west-2:1:cluster/prod", "kubernetes", "arn:aws:eks:us-west-2:1:cluster/prod", ""},
		{"*", "", "", ""},
		{"*/us-east-1", "", "us-east-1", ""},
	} {
		s := mustParse(t, minimal+"resources: {infra: \""+tt.infra+"\"}\n")
		r := s.Resources
		if r.Infra != tt.infra || r.Cloud != tt.cloud || r.Region != tt.region || r.Zone != tt.zone {
			t.Errorf("infra %q → %q/%q/%q, want %q/%q/%q", tt.infra, r.Cloud, r.Region, r.Zone, tt.cloud, tt.region, tt.zone)
		}
	}
	s := mustParse(t, minimal+"resources: {cloud: K8s, region: ctx, zone: z}\n")
	if r := s.Resources; r.Infra != "" || r.Cloud != "kubernetes" || r.Region != "ctx" || r.Zone != "z" {
		t.Errorf("cloud/region/zone → %+v", r)
	}
}

func TestResourcesScalars(t *testing.T) {
	s := mustParse(t, `run: x
resources:
  cpus: 4+
  memory: 32GB+
  disk_size: "1TB"
  disk_tier: HIGH
  network_tier: best
  instance_type: g5.xlarge
  image_id: docker:vllm/vllm-openai:latest
  labels: {team: ml, tier: 1}
  use_spot: yes
  ports: [8080, "9000-9010"]
  accelerator_args: {runtime_version: tpu-vm-base}
service:
  ports: 8080
`)
	r := s.Resources
	want := Resources{
		CPUs: "4+", Memory: "32GB+", DiskSize: 1024, DiskTier: "high", NetworkTier: "best",
		InstanceType: "g5.xlarge", ImageID: "docker:vllm/vllm-openai:latest",
		Labels: map[string]string{"team": "ml", "tier": "1"}, UseSpot: true,
		Ports: []string{"8080", "9000-9010"},
	}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("resources:\n got %+v\nwant %+v", r, want)
	}
	if s.Service.Port != 8080 {
		t.Errorf("Port = %d, want 8080", s.Service.Port)
	}
}

func TestPort(t *testing.T) {
	for _, tt := range []struct {
		src  string
		want int
	}{
		{minimal, 0},
		{minimal + "resources: {ports: 8000}\n", 8000},
		{minimal + "resources: {ports: \"8000\"}\n", 8000},
		{minimal + "resources: {ports: [\"8000-8000\"]}\n", 8000},
		{"run: x\nservice: {ports: 9000}\nresources: {ports: 8000-8010}\n", 9000},
		{minimal + "resources: {any_of: [{ports: 7000, cloud: aws}, {ports: 7000, cloud: gcp}]}\n", 7000},
	} {
		if got := mustParse(t, tt.src).Service.Port; got != tt.want {
			t.Errorf("%q: Port = %d, want %d", tt.src, got, tt.want)
		}
	}
}

func TestAnyOfMerge(t *testing.T) {
	s := mustParse(t, minimal+`resources:
  accelerators: {L4: 1, A10G: 1}
  use_spot: true
  cpus: 8
  infra: aws
  any_of:
    - {infra: gcp/us-central1}
    - {accelerators: "A100:1", cpus: null}
    - {infra: null, cloud: lambda, region: us-east-1}
`)
	r := s.Resources
	base := Resources{
		Accelerators: []Accelerator{{"L4", 1}, {"A10G", 1}}, UseSpot: true, CPUs: "8",
		Infra: "aws", Cloud: "aws",
	}
	want := []Resources{
		{Accelerators: base.Accelerators, UseSpot: true, CPUs: "8", Infra: "gcp/us-central1", Cloud: "gcp", Region: "us-central1"},
		{Accelerators: []Accelerator{{"A100", 1}}, UseSpot: true, Infra: "aws", Cloud: "aws"},
		{Accelerators: base.Accelerators, UseSpot: true, CPUs: "8", Cloud: "lambda", Region: "us-east-1"},
	}
	if !reflect.DeepEqual(r.AnyOf, want) {
		t.Errorf("any_of:\n got %+v\nwant %+v", r.AnyOf, want)
	}
	if r.Ordered != nil || r.Infra != "aws" || r.Cloud != "aws" || len(r.Accelerators) != 2 {
		t.Errorf("base changed: %+v", r)
	}
	// Spot knobs see use_spot through the candidates.
	mustParse(t, `run: x
resources:
  any_of: [{use_spot: true, cloud: aws}, {use_spot: true, cloud: gcp}]
service:
  replica_policy: {min_replicas: 1, base_ondemand_fallback_replicas: 1}
`)
	s = mustParse(t, minimal+"resources:\n  ordered: [{accelerators: H100}, {accelerators: A100}]\n")
	if len(s.Resources.Ordered) != 2 || s.Resources.Ordered[1].Accelerators[0].Name != "A100" {
		t.Errorf("ordered: %+v", s.Resources.Ordered)
	}
}

func TestProbeSubstitution(t *testing.T) {
	s := mustParse(t, `envs:
  MODEL_NAME: meta-llama/Llama-3.1-8B-Instruct
  QUOTE: 'say "hi"'
secrets:
  API_KEY: sk-123
run: x
service:
  readiness_probe:
    path: /v1/models
    post_data:
      model: $MODEL_NAME
      prompt: ${QUOTE} to $UNKNOWN
      max_tokens: 1
      stream: false
    headers:
      Authorization: Bearer $API_KEY
`)
	p := s.Service.ReadinessProbe
	wantBody := `{"max_tokens":1,"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"say \"hi\" to $UNKNOWN","stream":false}`
	if p.PostData != wantBody {
		t.Errorf("PostData = %s\nwant %s", p.PostData, wantBody)
	}
	if p.Headers["Authorization"] != "Bearer sk-123" {
		t.Errorf("Headers = %v", p.Headers)
	}
	s = mustParse(t, "run: x\nservice:\n  readiness_probe:\n    path: /\n    post_data: '{\"b\": 1e100, \"a\": [1, null]}'\n")
	if got := s.Service.ReadinessProbe.PostData; got != `{"a":[1,null],"b":1e100}` {
		t.Errorf("string post_data = %s", got)
	}
	s = mustParse(t, "run: x\nservice:\n  readiness_probe: {path: /, post_data: 'null'}\n")
	if got := s.Service.ReadinessProbe.PostData; got != "" {
		t.Errorf("post_data null = %q, want a GET", got)
	}
}

func TestArbiter(t *testing.T) {
	s := mustParse(t, minimal+`arbiter:
  models: [a, b]
  slo: {ttft_seconds: 0.5, tpot_seconds: 0.02, e2e_seconds: 30, percentile: 99.9}
  spot_policy: {max_price_ratio: 1}
  providers: [local, aws]
  reserved:
    - {provider: aws, region: us-east-1, accelerator: "H100:8", price_per_hour: 55.04}
    - {provider: local, accelerator: L4, count: 2}
  autoscaling: {signal: tokens_per_second, target_tokens_per_second_per_replica: 2000, stable_window_seconds: 4}
  readiness: {ready_budget_seconds: 100}
`)
	a := s.Arbiter
	if !reflect.DeepEqual(a.Models, []string{"a", "b"}) {
		t.Errorf("Models = %v", a.Models)
	}
	if a.SLO != (SLO{0.5, 0.02, 30, 0.999}) {
		t.Errorf("SLO = %+v", a.SLO)
	}
	wantReserved := []ReservedCapacity{
		{Provider: "aws", Region: "us-east-1", Accelerator: "H100", Count: 8, PricePerHour: 55.04},
		{Provider: "local", Accelerator: "L4", Count: 2},
	}
	if !reflect.DeepEqual(a.Reserved, wantReserved) {
		t.Errorf("Reserved = %+v", a.Reserved)
	}
	if a.Autoscaling.PanicWindowSeconds != 4 {
		t.Errorf("panic window should follow a shorter stable window: %+v", a.Autoscaling)
	}
	if a.Readiness.ReadyBudgetSeconds != 100 || a.SpotPolicy.MaxPriceRatio != 1 {
		t.Errorf("got %+v %+v", a.Readiness, a.SpotPolicy)
	}
	// rebalance_min_saving: auto (the default) moves when a move pays for its cold start; a
	// fraction is a fixed bar instead, and 0 never moves.
	for yaml, want := range map[string]SpotPolicy{
		"":                           {MaxPriceRatio: 0.6, MinZones: 2, RebalanceWhenItPays: true},
		"rebalance_min_saving: auto": {MaxPriceRatio: 0.6, MinZones: 2, RebalanceWhenItPays: true},
		"rebalance_min_saving: 0.2":  {MaxPriceRatio: 0.6, MinZones: 2, RebalanceMinSaving: 0.2},
		"rebalance_min_saving: 0":    {MaxPriceRatio: 0.6, MinZones: 2},
		"min_zones: 3":               {MaxPriceRatio: 0.6, MinZones: 3, RebalanceWhenItPays: true},
	} {
		if got := mustParse(t, minimal+"arbiter: {spot_policy: {"+yaml+"}}\n").Arbiter.SpotPolicy; got != want {
			t.Errorf("spot_policy {%s}: got %+v, want %+v", yaml, got, want)
		}
	}
	sim := mustParse(t, minimal+"arbiter:\n  providers: [sim]\n  sim: {cloud: aws, spot_trace: t, speedup: 600, start_hours: 2.5, prices_at: 2026-05-01, notice_seconds: 5}\n").Arbiter.Sim
	if sim != (Sim{Cloud: "aws", SpotTrace: "t", Speedup: 600, StartHours: 2.5, PricesAt: "2026-05-01", NoticeSeconds: 5}) {
		t.Errorf("Sim = %+v", sim)
	}
	if got := mustParse(t, minimal+"arbiter: {model: m}\n").Arbiter.Models; !reflect.DeepEqual(got, []string{"m"}) {
		t.Errorf("model: m → %v", got)
	}
	if got := mustParse(t, minimal+"arbiter: {tasks: [embed, score]}\n").Arbiter.Tasks; !reflect.DeepEqual(got, []string{"embed", "score"}) {
		t.Errorf("tasks: [embed, score] → %v", got)
	}
	checkRoundTrip(t, []byte(minimal+"arbiter: {tasks: transcription}\n"))
	for src, want := range map[string]string{
		"arbiter: {tasks: [rerank]}\n":       `arbiter.tasks: "rerank" is not a task vLLM serves: want one of generate, embed, classify, score, transcription`,
		"arbiter: {tasks: [embed, embed]}\n": `arbiter.tasks: "embed" is listed twice`,
		"arbiter: {tasks: []}\n":             "arbiter.tasks: want at least one of generate",
	} {
		if _, err := Parse("s.yaml", []byte(minimal+src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", src, err, want)
		}
	}
}

func TestOverrides(t *testing.T) {
	src := []byte("name: file-name\nenvs: {HF_TOKEN: null, A: '1'}\nrun: x\nservice: {readiness_probe: {path: /, headers: {X: $HF_TOKEN}}}\n")
	if _, err := Parse("svc.yaml", src); err == nil {
		t.Fatal("null env without override should fail")
	}
	s, err := ParseWith("svc.yaml", src, Overrides{Name: "cli-name", Envs: map[string]string{"HF_TOKEN": "hf_x"}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "cli-name" || s.Envs["HF_TOKEN"] != "hf_x" || s.Envs["A"] != "1" {
		t.Errorf("got name %q envs %v", s.Name, s.Envs)
	}
	if s.Service.ReadinessProbe.Headers["X"] != "hf_x" {
		t.Errorf("override not substituted: %v", s.Service.ReadinessProbe.Headers)
	}
	if _, err := ParseWith("svc.yaml", src, Overrides{Name: "bad name", Envs: map[string]string{"HF_TOKEN": "x"}}); err == nil {
		t.Error("invalid override name accepted")
	}
	if _, err := ParseWith("svc.yaml", src, Overrides{Envs: map[string]string{"HF_TOKEN": "x", "BAD-NAME": "y"}}); err == nil {
		t.Error("invalid override variable name accepted")
	}
	s, err = ParseWith("svc.yaml", src, Overrides{Secrets: map[string]string{"HF_TOKEN": "from-secret"}, Envs: map[string]string{"HF_TOKEN": "e"}})
	if err != nil || s.Service.ReadinessProbe.Headers["X"] != "from-secret" {
		t.Errorf("secrets should win over envs in substitution: %v %v", err, s)
	}
}

func TestExamples(t *testing.T) {
	s, err := Load("../examples/skyserve-vllm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Service.ReadinessProbe.Path != "/v1/models" || s.Service.Port != 8000 || !s.Resources.UseSpot ||
		s.Arbiter.Autoscaling.Signal != "qps" || s.Service.ReplicaPolicy.MaxReplicas != 3 {
		t.Errorf("skyserve-vllm.yaml: %+v", s)
	}
	s, err = Load("../examples/local.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Service.ReplicaPolicy.MinReplicas != 0 || s.Arbiter.SLO.Percentile != 0.9 || s.Arbiter.Local.Capacity != "reserved" ||
		s.Arbiter.ScaleToZeroAfterSeconds != 60 || s.Arbiter.Autoscaling.TargetConcurrencyPerReplica != 4 ||
		!strings.Contains(s.Run, "replicasim") {
		t.Errorf("local.yaml: %+v", s)
	}
	if _, err := Load("../examples/does-not-exist.yaml"); err == nil {
		t.Error("missing file loaded")
	}
}

// roundTripSources are valid files covering every form ResolvedYAML must write back.
var roundTripSources = []string{
	minimal,
	"run: x\nservice: {}\n",
	"name: s\nworkdir: .\nsetup: |\n  pip install x\n  echo done\nrun: |\n  a\n  b  \nservice: {replicas: 1}\n",
	"run: x\nenvs: {PORT: 8000, FLAG: true, E: ''}\nsecrets: {T: tok}\nservice: {replica_policy: {min_replicas: 1, max_replicas: 5, target_qps_per_replica: 0.1, num_overprovision: 2}}\n",
	"run: x\nenvs: {M: model, N: $M}\nservice:\n  readiness_probe:\n    path: /$M\n    post_data: {model: $N, n: [1, 2.5, 1e300, true, null, {a: b}]}\n    headers: {Authorization: Bearer $M}\n",
	"run: x\nservice:\n  readiness_probe: {path: /, post_data: '{\"z\": 12345678901234567890, \"a\": \"<&>\"}'}\n",
	"run: x\nresources:\n  use_spot: true\n  infra: gcp/*/us-east1-b\n  labels: {k: 'multi\n\n    line'}\n  any_of:\n    - {}\n    - {use_spot: true, cpus: 2+, infra: null, cloud: aws}\n    - {accelerators: [A100, V100]}\nservice:\n  replica_policy: {min_replicas: 1, base_ondemand_fallback_replicas: 1, dynamic_ondemand_fallback: true, spot_placer: dynamic_fallback}\n",
	"run: x\nresources:\n  cloud: gcp\n  region: us-east1\n  disk_size: 100\n  ordered:\n    - {infra: aws, cloud: null, region: null, ports: 8000}\n    - {region: null, disk_size: null, ports: 8000}\nservice: {}\n",
	"run: x\nservice:\n  load_balancing_policy: instance_aware_least_load\n  replica_policy: {min_replicas: 0, max_replicas: 9, target_qps_per_replica: {\"H100:8\": 40, L4: 1.5}}\n",
	"run: vllm serve m --scheduling-policy priority\nservice: {}\narbiter: {queue: {engine_priority: true}}\n",
	"run: x\nservice: {}\narbiter: {tenants: [{name: nightly, priority: sheddable}, {name: app, priority: critical, weight: 2.5}, {name: '42', weight: 1}]}\n",
	"run: vllm serve m --scheduling-policy=priority\nservice: {}\narbiter: {queue: {enabled: true, engine_priority: true, sheddable_fill: 0.5}}\n",
	"run: x\nservice: {replica_policy: {min_replicas: 0, max_replicas: 2}}\narbiter:\n  autoscaling: {signal: tokens_per_second, target_tokens_per_second_per_replica: 1500}\n  providers: [sim, kubernetes, aws, local]\n  reserved: [{provider: aws, accelerator: \"H100:8\", zone: z, price_per_hour: 1e-7}, {provider: local, accelerator: \"A10G:1\", count: 1}]\n  local: {region: '', zone: '123'}\n  slo: {percentile: 1.5}\n",
}

func TestResolvedYAMLRoundTrip(t *testing.T) {
	srcs := append([]string(nil), roundTripSources...)
	for _, f := range []string{"../examples/skyserve-vllm.yaml", "../examples/local.yaml"} {
		s, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		out, err := s.ResolvedYAML()
		if err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, string(out))
	}
	for _, src := range srcs {
		checkRoundTrip(t, []byte(src))
	}
}

// checkRoundTrip asserts that src's resolved form parses back to an equal Service and
// renders to the same bytes again.
func checkRoundTrip(t *testing.T, src []byte) {
	t.Helper()
	s, err := Parse("in.yaml", src)
	if err != nil {
		t.Fatalf("Parse:\n%s\n%v", src, err)
	}
	out, err := s.ResolvedYAML()
	if err != nil {
		t.Fatalf("ResolvedYAML of:\n%s\n%v", src, err)
	}
	s2, err := Parse("resolved.yaml", out)
	if err != nil {
		t.Fatalf("re-Parse of resolved:\n%s\nfrom:\n%s\n%v", out, src, err)
	}
	s.accPos, s2.accPos = nil, nil // where names are written differs between the two files
	s.workdirPos, s2.workdirPos = Pos{}, Pos{}
	s.warnings, s2.warnings = nil, nil
	if !reflect.DeepEqual(s, s2) {
		t.Fatalf("round trip changed the service\nsource:\n%s\nresolved:\n%s\nfirst:  %+v\nsecond: %+v", src, out, s, s2)
	}
	out2, err := s2.ResolvedYAML()
	if err != nil || string(out2) != string(out) {
		t.Fatalf("ResolvedYAML not stable:\n%s\nthen:\n%s (err %v)", out, out2, err)
	}
}

func TestPathologicalInput(t *testing.T) {
	for name, src := range map[string]string{
		"deep flow nesting": strings.Repeat("[", 20000) + strings.Repeat("]", 20000),
		"deep block nesting": func() string {
			var b strings.Builder
			for i := range 5000 {
				b.WriteString(strings.Repeat(" ", i) + "a:\n")
			}
			return b.String()
		}(),
		"alias bomb": `a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
run: x
service: {}
config: *g
`,
		"too large":     strings.Repeat("#", maxFileSize+1),
		"many bad keys": strings.Repeat("unknown_key_here_xyz_"+strings.Repeat("q", 200)+": 1\n", 2000)[:200000],
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse("p.yaml", []byte(src)); err == nil {
				t.Error("accepted")
			}
		})
	}
}

func TestLoadTooLarge(t *testing.T) {
	path := t.TempDir() + "/big.yaml"
	if err := os.WriteFile(path, []byte(minimal+strings.Repeat("#", maxFileSize)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(e.Msg, "likely the wrong file") || e.File != path {
		t.Errorf("Load of an oversized file: %v", err)
	}
}

// arbiter.profile takes the measured profiles and any pair the engine can generate.
func TestProfileNames(t *testing.T) {
	for _, name := range []string{"h100-llama-3.1-8b", "L4-llama-3.1-8b", "a100-80gb-llama-2-7b", "h100x4-llama-3.1-70b"} {
		s := mustParse(t, minimal+"arbiter: {profile: "+name+"}\n")
		if s.Arbiter.Profile != strings.ToLower(name) {
			t.Errorf("profile %s read as %q", name, s.Arbiter.Profile)
		}
	}
}

func TestAvailabilityTarget(t *testing.T) {
	for src, want := range map[string]float64{"99.9": 0.999, "0.995": 0.995, "99.99": 0.9999, "95": 0.95} {
		s := mustParse(t, minimal+"resources: {use_spot: true}\narbiter: {availability: "+src+"}\n")
		if s.Arbiter.Availability != want {
			t.Errorf("availability: %s read as %v, want %v", src, s.Arbiter.Availability, want)
		}
		checkRoundTrip(t, []byte(minimal+"resources: {use_spot: true}\narbiter: {availability: "+src+"}\n"))
	}
	if s := mustParse(t, minimal+"resources: {use_spot: true}\n"); s.Arbiter.Availability != 0 {
		t.Errorf("no availability given: %v, want 0 (no target)", s.Arbiter.Availability)
	}
}

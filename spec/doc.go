// Package spec loads and validates service.yaml, the file a platform engineer hands to
// `serve up`.
//
// The format is SkyServe's task YAML, so that a file written for `sky serve up` loads here
// unchanged and means the same thing: top-level name, workdir, num_nodes, envs, secrets,
// resources, setup, run (required), service (required), file_mounts, volumes and config.
// Arbiter's own settings live under one extra top-level key, arbiter:, so SkyServe's keys
// keep SkyServe's meaning and defaults.
//
// Every problem is reported with file:line:col and a sentence saying what to write instead;
// unknown keys get the closest allowed key ("did you mean ...?"). Parse reports all
// problems it can find in one pass, in file order, as an *ErrorList. YAML anchors and
// aliases are refused, which keeps parsing cheap on hostile input.
//
// # SkyServe rules enforced
//
//   - service: replicas or replica_policy, not both; neither means one fixed replica.
//   - replica_policy: min_replicas is required; max_replicas defaults to it, must be ≥ it,
//     and must equal it unless target_qps_per_replica is set. Arbiter relaxes the last rule
//     when arbiter.autoscaling.signal is set to concurrency or tokens_per_second.
//     Unlike SkyServe, Arbiter holds every replica alive to max_replicas: on-demand
//     stand-ins (dynamic_ondemand_fallback), num_overprovision, a preempted replica's
//     replacement and replicas still draining all count; what does not fit waits, and the
//     placement's reason says the bound binds (an update's old version is the exception,
//     and so is a replica serving out a preemption notice: it is gone at the deadline
//     whatever happens, and its replacement must not wait for it).
//   - target_qps_per_replica as a map (per accelerator) requires load_balancing_policy
//     instance_aware_least_load, and that policy requires the map.
//   - base_ondemand_fallback_replicas, dynamic_ondemand_fallback, spot_placer and
//     arbiter.availability require resources.use_spot: true (in resources, or in every
//     any_of/ordered entry).
//   - readiness_probe paths start with /; $VARS from envs and secrets are substituted into
//     the probe's path, header values and post_data string values.
//   - resources: infra or cloud/region/zone, not both; any_of or ordered, not both; several
//     accelerators as a list cannot be combined with any_of, nor several in any form with
//     ordered; job_recovery is refused; ports are 1–65535.
//   - accelerators: one name at several counts ({A100:4, A100:8}) is several candidates, as
//     in SkyPilot; the same name:count twice is refused. Names no catalog prices are left
//     to pricing.Resolve, which knows the catalogs and providers (Service.AcceleratorPositions
//     gives it the places to warn at).
//   - service.tls: keyfile and certfile, both required (the endpoint serves HTTPS).
//
// # Mounts, config and nodes, held to what the providers do
//
// What a provider in arbiter.providers cannot honour is refused at its place, naming the
// key and the provider; nothing is dropped without a word.
//
//   - file_mounts: a local folder (PATH: ~/dir) on local and sim, whose replicas find it
//     at PATH (a symlink the provider makes); an S3 bucket (PATH: s3://b, or the block
//     form with source/name+store and mode MOUNT, COPY or MOUNT_CACHED) on aws, mounted
//     or copied by the instance's user data. Buckets elsewhere, folders on remote
//     providers, and the block form with a local source (a bucket SkyPilot would create)
//     are refused.
//   - volumes: PATH: NAME mounts an existing PersistentVolumeClaim on kubernetes; refused
//     on every other provider, and the block form (an ephemeral volume) everywhere.
//   - config: the keys SkyPilot lets a task override. kubernetes.custom_metadata (labels,
//     annotations) is set on the kubernetes provider's pods; the other keys are refused
//     while a provider they are about is in use, and otherwise accepted with a warning
//     (Service.Warnings) that they have no effect, as SkyPilot ignores a cloud's keys on
//     another cloud. Unknown keys are refused.
//   - num_nodes: N ≥ 1; a replica is a group of N nodes (local processes, kubernetes
//     pods in one zone or one LeaderWorkerSet, aws instances in one cluster placement
//     group) launched, probed through the head (rank 0), billed N times, preempted and
//     terminated together. At most 16 on aws; refused on runpod, which launches one pod
//     per replica.
//
// # Arbiter's keys
//
//	| key                                               | default                            | meaning |
//	|---------------------------------------------------|------------------------------------|---------|
//	| arbiter.model / arbiter.models                    | none (any model)                   | model names clients send; one string, or a list |
//	| arbiter.routing_policy                            | slo_cheapest                       | slo_cheapest, least_load or round_robin; if unset and service.load_balancing_policy is given, round_robin → round_robin, least_load and instance_aware_least_load → least_load |
//	| arbiter.profile                                   | none (the router's default)        | the replicas' GPU and model shape, one of h100-llama-3.1-8b, h100-llama-3.2-1b, h200-llama-3.1-8b, h200-llama-3.2-1b: routers predict TTFT and TPOT with its measured step times, corrected by what replicas answer |
//	| arbiter.tasks                                     | none (learned from refusals)       | what the model serves, by vLLM's task names: generate, embed, classify, score, transcription; one or a list. Routers send the service's replicas only the requests of those tasks (generate: chat, completions, responses; embed: embeddings, pooling, score, rerank; classify: classify, pooling; score: score, rerank, classify, pooling; transcription: audio) |
//	| arbiter.slo.ttft_seconds                          | 2                                  | time-to-first-token target; 0 = none |
//	| arbiter.slo.tpot_seconds                          | 0.1                                | time-per-output-token target; 0 = none |
//	| arbiter.slo.e2e_seconds                           | 0 (none)                           | end-to-end latency target |
//	| arbiter.slo.percentile                            | 90                                 | percentile the targets hold at; 90 or 0.9 |
//	| arbiter.spot_policy.max_price_ratio               | 0.6                                | use spot only while spot price < ratio × on-demand/reserved; in (0, 1] |
//	| arbiter.spot_policy.rebalance_min_saving          | auto                               | auto: move a ready spot replica (replacement first) to a zone quiet for an hour when the move pays for its cold start, the zones' preemptions priced in; a fraction in (0, 1): to a zone at least that much cheaper; 0: never; needs room under max_replicas for the replacement and one GPU type |
//	| arbiter.spot_policy.min_zones                     | 2                                  | no zone holds more than ⌈spot replicas ÷ min_zones⌉ of the spot fleet; with ≥ 2, a target of 1 on spot alone runs a second spot replica in another zone while the pair costs ≤ max_price_ratio × on-demand (1: neither) |
//	| arbiter.reserved[]                                | none                               | capacity already paid for: provider, region, zone, accelerator ("H100:8"), count, price_per_hour |
//	| arbiter.providers                                 | [local]                            | where replicas may run: local, sim, kubernetes, aws, runpod; local beside another only through arbiter.reserved slots |
//	| arbiter.availability                              | none                               | share of time a replica is ready that spot purchasing must keep, e.g. 99.9 or 0.999: the cheapest hedge predicted to meet it (a second spot zone, one replica on-demand); needs use_spot |
//	| arbiter.scale_to_zero_after_seconds               | 300                                | idle time before the last replica goes, when min_replicas is 0 |
//	| arbiter.autoscaling.signal                        | concurrency (qps if target_qps_per_replica is set) | qps, concurrency or tokens_per_second |
//	| arbiter.autoscaling.target_concurrency_per_replica| 8                                  | in-flight requests one replica should carry |
//	| arbiter.autoscaling.target_tokens_per_second_per_replica | none                        | required for the tokens_per_second signal |
//	| arbiter.autoscaling.stable_window_seconds         | 60                                 | averaging window for scaling decisions |
//	| arbiter.autoscaling.panic_window_seconds          | 6 (at most the stable window)      | short window that triggers fast scale-up; 0 turns panic mode off |
//	| arbiter.autoscaling.panic_threshold               | 2                                  | panic when panic-window demand ≥ threshold × ready capacity; ≥ 1 |
//	| arbiter.autoscaling.max_scale_up_rate             | 4                                  | one decision asks for at most this × max(ready, 1) replicas; ≥ 1 |
//	| arbiter.autoscaling.decision_interval_seconds     | 1                                  | how often the target is recomputed |
//	| arbiter.readiness.probe_interval_seconds          | 10                                 | time between readiness probes |
//	| arbiter.readiness.failure_threshold               | 3                                  | consecutive failures before a ready replica is taken out |
//	| arbiter.readiness.ready_budget_seconds            | initial_delay_seconds + 300        | a replica not ready this long after launch is replaced |
//	| arbiter.local.capacity                            | reserved                           | how local replicas are billed: reserved, spot or on_demand |
//	| arbiter.local.price_per_hour                      | 0                                  | their price in the cost metrics |
//	| arbiter.local.region / arbiter.local.zone         | local / local                      | their labels |
//
// Service.ResolvedYAML writes a loaded service back with every default filled in, in a
// fixed order; parsing that output gives an equal Service.
package spec

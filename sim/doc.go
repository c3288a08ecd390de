// Package sim is Arbiter's trace-driven, discrete-event simulator. It replays a real
// request trace against replicas modelled by the engine package (the performance model
// replicasim serves with), under real spot availability or preemption traces and real
// catalog prices, for a simulated day or more in seconds.
//
// Nothing in the decision path is re-implemented here: requests are routed by the router
// package's policies over router.Replica views (load projection, latency predictor and
// marginal cost, fed the same way the proxy feeds them), the replica target comes from
// scaling.Decider and the purchase mix and zones from scaling.Placer, all driven by a
// virtual clock. What the simulator owns is only what the real system gets from outside:
// time, the GPUs' speed, the clouds' capacity and prices, and how each system's control
// loop is wired (how often it decides, how its balancer learns of replicas, what it does at
// a preemption notice).
//
// The systems run on the same inputs:
//
//   - arbiter: the spec's routing policy, signal, windows and spot rule; routers see the
//     ready set at once (long poll), hold requests while no replica is ready, drain a
//     replica at its preemption notice and launch its replacement then.
//   - skyserve: SkyServe as it ships (SKYSERVE.md): least_load counted by the balancer,
//     QPS over 60 s decided every 20 s with 300 s / 1200 s hysteresis, its spot placer
//     (active zones holding none of the service's spot replicas first, then the cheapest)
//     with the spec's fallbacks, a balancer that learns the ready set every 20 s, no
//     use of notices (a preemption is seen by the next failed probe), connection errors
//     retried up to 3 times with 1 s × 1.6^k backoff, 503 when nothing is ready, and
//     replicas terminated 120 s after scale-down.
//   - skyserve-spothedge: skyserve with SpotHedge as SkyPilot documents it and the SkyServe
//     paper evaluates it: one overprovisioned spot replica and dynamic on-demand fallback.
//   - skyserve-ondemand: skyserve with use_spot off.
//   - ondemand: arbiter with use_spot off.
//
// Modelling choices (each one is a parameter of Inputs or documented at its use):
//
//   - Streams: every request is streamed, so a request whose replica dies after accepting
//     it has already had its response headers and fails; one sent to a replica that is
//     already gone (a stale balancer list) gets a connection error and may be retried.
//   - Spot capacity, read one of two ways (Inputs.Reading). As availability (the default):
//     a spot replica may launch in a zone while the trace shows capacity there
//     (availability > 0, or running > 0 for preemption traces), without limit, and a drop
//     preempts the same share of the service's spot replicas in that zone (all of them when
//     the zone goes to 0). As counts: a value is the number of spot instances the zone
//     has (what the source documents: obtainable for availability traces, running for
//     preemption traces), so the service holds at most that many there and a fall to m
//     takes back all but m. Victims go newest first. The drop's tick is the moment the VM
//     is gone; the provider's notice (AWS 120 s, GCP and Azure 30 s, shared/data/README.md)
//     arrives that long before it.
//   - Trace zones are mapped onto the catalog zones that quote the service's resources with
//     traces.SpotTrace.MapZones: the same zone, else the same region, country, continent,
//     in that order (an AWS us-east-1 trace drives GCP's US zones); the mapping and its
//     rules are printed by cmd/simulate. A catalog zone that several trace zones map onto
//     has the sum of their values. Spot offers in zones no trace zone maps to are not used.
//   - Cold start: launch to ready is Inputs.ColdStart for every system (default 294 s, the
//     published vLLM cold start with nothing cached; VM provisioning has no published
//     measurement and is not added).
//   - Billing: a replica is billed its offer's price from launch until it is terminated or
//     preempted, whatever its state (loading weights and draining are billed).
//   - Prices are quoted from the catalog at Inputs.Start plus the simulated time, once an
//     hour.
package sim

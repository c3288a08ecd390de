// Package traces loads the real request and spot-capacity traces that the
// trace-driven simulator replays, and ships copies of them (see
// data/README.md for sources and licences) so that a simulation needs no
// checkout of shared/.
//
// # Request traces
//
// LoadRequests and NamedRequests return a RequestTrace: arrivals in file
// order (which must be arrival order; an out-of-order row is an error, not
// something to sort away), each with prompt and output token counts.
//
//   - Azure LLM inference trace 2023 (Splitwise), "azure-code" (8,819
//     requests, 57.3 min) and "azure-conversation" (19,366, 58.4 min): CSV
//     TIMESTAMP,ContextTokens,GeneratedTokens. TIMESTAMP is wall-clock,
//     100 ns resolution, no time zone; it is read as UTC and kept in
//     RequestTrace.Start for the first row. No prefix data.
//   - Mooncake FAST'25 conversation trace (Kimi), "mooncake-conversation-30min"
//     (5,719 requests, first 30 min of the published hour): JSON lines with
//     timestamp (ms from the trace start), input_length, output_length and
//     hash_ids. hash_ids become Request.PrefixBlocks; each covers
//     MooncakeBlockTokens = 512 prompt tokens, a constant that comes from the
//     Mooncake README, not from the file.
//
// The format is told from the content (a '{' first means Mooncake; otherwise
// the Azure header must match exactly), and gzip-compressed files are
// accepted. Token counts are tokens; there is no unit conversion anywhere.
//
// Time base: Request.At is the offset from the first request of the file,
// for both formats, so every trace starts at 0 whatever slice of a day it
// was cut from; the Mooncake file's own first timestamp is kept in
// StartOffset (0 for the shipped file).
//
// Tiling: the traces cover 30-60 min and the simulations 24 h or more.
// RequestTrace.Tile repeats a trace back to back with period Duration,
// keeping requests before the requested total. Neither dataset records where
// its observation window ends, so Duration is derived as the span of the
// arrivals plus one mean inter-arrival gap (Span + Span/(n-1)): repeated
// copies keep the trace's mean rate and are separated by an average gap
// instead of landing on the same instant. Tile(total) returns
// floor(total/Duration)*n requests plus the prefix of one more copy that
// arrives before total, never more than ceil(total/Duration)*n. Prefix block
// ids of copy k are shifted by k*(max id + 1) so that a replayed copy cannot
// hit cache entries left by the previous one. Duration is an exported field:
// callers who know the true window (exactly 30 min for the Mooncake half,
// per its README) can set it before tiling.
//
// # Spot traces
//
// LoadSpot and NamedSpot return a SpotTrace: for each zone, a count over
// time, and the changes of that count as SpotEvents.
//
//   - SkyPilot "Can't Be Late" traces (NSDI'24): one JSON file per zone and
//     resource, {"metadata": {"gap_seconds": g}, "data": [...], "prices"?: [...]}.
//     data[i] holds on [i*g, (i+1)*g) from the unknown start of the set; the
//     gap varies by set (30 s to 600 s) and is read from each file, never
//     assumed. Files under availability/ count spot instances that could be
//     obtained (SeriesAvailability: 0/1 for 1-node sets, 0-16 for the 16-node
//     set); files under preemption/ count spot instances that were running
//     (SeriesRunning: 0/1 or 0-4), where a drop is a preemption. Zones of one
//     set share the start and gap but not always the length (the 16-node
//     us-east-2b file is 3,247 ticks, its siblings 4,736), so each zone has
//     its own ZoneEnd and Available reports ok=false past it. "prices", where
//     present, is the spot price in USD/hour per tick (SpotTrace.Price).
//   - SpotServe (ASPLOS'24) g4dn trace, "spotserve-g4dn": CSV rows
//     time_ms,add|remove,nodeN with no header; 153 events over 10.77 h. The
//     file records no zone, so its single zone is UnknownZone ("unknown").
//     Step is the greatest common divisor of the event times (60 s), and the
//     trace is taken to cover one Step past its last event, as a tick trace
//     of n ticks covers n*gap.
//
// Embedded names: "skypilot-<availability|preemption>-<set>-<resource>", one
// per set directory and resource, e.g.
// "skypilot-availability-aws-02-15-2023-v100_1" (nine AWS zones, 195 s ticks,
// 45.5 days) or "skypilot-preemption-aws-04-22-2023-v100_1"; SpotNames lists
// them. LoadSpot on a directory loads its zones the same way; sets that mix
// resources (availability/1-node/aws-10-26-2022) take a glob such as
// "*_v100_1.json". Resource tags map to instance types as the spot-traces
// README gives them: v100_1 = p3.2xlarge, v100_8 = p3.16xlarge,
// intel_64 = r5.16xlarge (CPU), c3-88 = GCP c3-highcpu-88 (CPU); the k80 tags
// are left without an instance type (see SpotTrace.InstanceType).
//
// Events: a SkyPilot event is a change between consecutive ticks, stamped
// with the tick at which the new value was first seen (the change happened
// during the preceding gap); one event per change, with Delta the size of
// the jump. Kinds: KindPreempted and KindAcquired for SeriesRunning,
// KindUnavailable and KindAvailable for SeriesAvailability. Preemptions
// returns only KindPreempted events, so it is empty for availability traces:
// whether a capacity drop preempts simulated replicas depends on how many the
// simulator holds in that zone, which it decides from Available. Each
// SpotServe row is one event of Delta 1 carrying its node id.
//
// # Zone mapping
//
// The SkyPilot traces name AWS zones by AZ name ("us-east-1a"); the AWS price
// catalog in shared/data names them by AZ id ("use1-az4"); GCP uses zone
// names in both. AWS maps AZ names to AZ ids differently in every account
// and the traces do not record the account, so no name-to-id mapping is
// correct, and MapZones only promises a stable, documented one:
//
//  1. a trace zone present in the catalog maps to itself;
//  2. otherwise to a catalog zone of the same region, the region's trace
//     zones in sorted order taking its catalog zones in sorted order, zones
//     no other trace zone has taken first, round robin (so four us-east-1
//     trace zones and catalog ids use1-az1, -az2, -az4, -az6 pair up in that
//     order; two us-east-2 zones and one catalog id share it);
//  3. a zone whose region the catalog lacks takes, in the same manner, the
//     catalog zones of its country (US) or else of its continent (Geography);
//  4. only a zone with no catalog zone on its continent, or whose name has no
//     region (UnknownZone), takes zones of the whole catalog, and
//     ExplainZones's rule says it crossed continents.
//
// Regions are compared via AWS's AZ-id prefix convention (us-east-1 → use1,
// ap-southeast-2 → apse2, checked against every region of the catalog) and
// GCP zone names (us-central1-a → us-central1). The catalog list may contain
// duplicates and empty strings (one row per instance type); the result
// depends only on the set of names.
package traces

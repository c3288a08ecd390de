package spec

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/arbiter-serve/arbiter/engine"
)

// crossCheck applies the rules that span sections, and settles the defaults that depend on
// more than one section. A rule whose inputs were already reported invalid is skipped, so
// that one mistake gives one message.
func (d *decoder) crossCheck(s *Service) {
	svc := &s.Service
	rp := &svc.ReplicaPolicy
	a := &s.Arbiter
	const policy = "service.replica_policy."

	// A workload hint longer than the model's context is no request the model can take
	// (vLLM refuses a prompt plus max_tokens past max_model_len).
	if w := a.Workload; w.PromptTokens > 0 && w.OutputTokens > 0 && !d.failed("arbiter.workload.prompt_tokens", "arbiter.workload.output_tokens") {
		if m, ok := WorkloadModel(a); ok && w.PromptTokens+w.OutputTokens > m.Context {
			d.errorAt("arbiter.workload", "arbiter.workload: %d prompt plus %d output tokens exceed %s's context of %d tokens", w.PromptTokens, w.OutputTokens, m.Name, m.Context)
		}
	}

	// Spot fallback has nothing to fall back from without spot replicas.
	if !usesSpot(s.Resources) {
		for _, k := range []struct {
			key string
			set bool
		}{
			{"base_ondemand_fallback_replicas", rp.BaseOndemandFallbackReplicas > 0},
			{"dynamic_ondemand_fallback", rp.DynamicOndemandFallback},
			{"spot_placer", rp.SpotPlacer != ""},
		} {
			if k.set {
				d.errorAt(policy+k.key, "%s%s: needs resources.use_spot: true (in resources, or in every any_of/ordered entry)", policy, k.key)
			}
		}
		if a.Availability > 0 {
			d.errorAt("arbiter.availability", "arbiter.availability: a target for spot purchasing; it needs resources.use_spot: true (on-demand replicas are not preempted)")
		}
	}

	hasQPSTarget := rp.TargetQPSPerReplica > 0 || rp.TargetQPSByAccelerator != nil
	explicitSignal := d.given("arbiter.autoscaling.signal")
	if !explicitSignal {
		a.Autoscaling.Signal = "concurrency"
		if hasQPSTarget {
			a.Autoscaling.Signal = "qps"
		}
	}
	switch a.Autoscaling.Signal {
	case "qps":
		if !hasQPSTarget && !d.failed(policy+"target_qps_per_replica") {
			d.errorAt("arbiter.autoscaling.signal", "arbiter.autoscaling.signal: qps needs service.replica_policy.target_qps_per_replica")
		}
	case "tokens_per_second":
		if a.Autoscaling.TargetTokensPerSecondPerReplica == 0 && !d.failed("arbiter.autoscaling.target_tokens_per_second_per_replica") {
			d.errorAt("arbiter.autoscaling.signal", "arbiter.autoscaling.signal: tokens_per_second needs arbiter.autoscaling.target_tokens_per_second_per_replica")
		}
	}

	// SkyServe only autoscales on QPS, so without a QPS target it pins max to min. Arbiter
	// also autoscales on concurrency or token throughput, so an explicit arbiter signal of
	// either lifts the rule. It stays for files that name no signal, so that a SkyServe
	// file means here what it meant there.
	if svc.Fixed && rp.MaxReplicas < 1 && !d.failed("service.replicas") {
		d.errorAt("service.replicas", "service.replicas: must be ≥ 1 (a service that may run no replica serves nothing; for scale to zero write replica_policy: {min_replicas: 0, max_replicas: N})")
	}
	if !svc.Fixed && !d.failed(policy+"min_replicas", policy+"max_replicas", policy+"target_qps_per_replica") {
		switch {
		case rp.MaxReplicas < 1:
			d.errorAt("service.replica_policy", "%smax_replicas: must be ≥ 1 (it defaults to min_replicas, %d); with min_replicas: 0 write the most replicas the service may scale to", policy, rp.MinReplicas)
		case rp.MaxReplicas < rp.MinReplicas:
			d.errorAt(policy+"max_replicas", "%smax_replicas: must be ≥ min_replicas (%d), got %d", policy, rp.MinReplicas, rp.MaxReplicas)
		case rp.MaxReplicas != rp.MinReplicas && !hasQPSTarget && !(explicitSignal && a.Autoscaling.Signal != "qps"):
			d.errorAt(policy+"max_replicas", "%smax_replicas: must equal min_replicas (%d) unless target_qps_per_replica is set, or arbiter.autoscaling.signal is concurrency or tokens_per_second", policy, rp.MinReplicas)
		}
	}

	const iall = "instance_aware_least_load"
	if rp.TargetQPSByAccelerator != nil && svc.LoadBalancingPolicy != iall && !d.failed("service.load_balancing_policy") {
		d.errorAt(policy+"target_qps_per_replica", "%starget_qps_per_replica: the per-accelerator form needs service.load_balancing_policy: %s", policy, iall)
	}
	if svc.LoadBalancingPolicy == iall && rp.TargetQPSByAccelerator == nil && !d.failed(policy+"target_qps_per_replica") {
		d.errorAt("service.load_balancing_policy", "service.load_balancing_policy: %s needs target_qps_per_replica as a mapping of accelerator to QPS, e.g. {A100: 5, L4: 2}", iall)
	}

	// A SkyServe user who chose a balancing policy keeps it unless they pick an Arbiter one.
	if !d.given("arbiter.routing_policy") && d.given("service.load_balancing_policy") {
		switch svc.LoadBalancingPolicy {
		case "round_robin":
			a.RoutingPolicy = "round_robin"
		case "least_load", iall:
			a.RoutingPolicy = "least_load"
		}
	}

	// The routers judge a replica's room for a request by slo_cheapest's predictions: under
	// another policy the queue would never hold a request, so asking for it is a mistake.
	if a.Queue.Enabled && a.RoutingPolicy != "slo_cheapest" && !d.failed("arbiter.routing_policy", "arbiter.queue.enabled") {
		d.errorAt("arbiter.queue.enabled", "arbiter.queue.enabled: the queue needs routing_policy slo_cheapest, whose predictions judge when a replica has room; this service routes by %s", a.RoutingPolicy)
	}

	if !d.given("arbiter.readiness.ready_budget_seconds") {
		a.Readiness.ReadyBudgetSeconds = svc.ReadinessProbe.InitialDelaySeconds + readyBudgetMargin
	}

	// The panic window looks at the most recent part of the stable window; a short stable
	// window given alone pulls the default panic window down with it.
	if !d.given("arbiter.autoscaling.panic_window_seconds") {
		a.Autoscaling.PanicWindowSeconds = min(a.Autoscaling.PanicWindowSeconds, a.Autoscaling.StableWindowSeconds)
	}
	if as := a.Autoscaling; as.PanicWindowSeconds > as.StableWindowSeconds {
		d.errorAt("arbiter.autoscaling.panic_window_seconds", "arbiter.autoscaling.panic_window_seconds: must be ≤ stable_window_seconds (%g), got %g", as.StableWindowSeconds, as.PanicWindowSeconds)
	}

	// The autoscaler's own rules (scaling.Config.Validate), so that a spec accepted here is
	// one the control plane can run; scaling's FuzzAcceptedSpecsRun holds the two together.
	if as := a.Autoscaling; as.PanicWindowSeconds > 0 && as.PanicThreshold <= 1 && !d.failed("arbiter.autoscaling.panic_threshold", "arbiter.autoscaling.panic_window_seconds") {
		d.errorAt("arbiter.autoscaling.panic_threshold", "arbiter.autoscaling.panic_threshold: must be > 1 while panic mode is on (panic_window_seconds %g), got %g: at 1 ordinary steady load would count as a panic, and panic never scales down; write panic_window_seconds: 0 to turn panic mode off", as.PanicWindowSeconds, as.PanicThreshold)
	}
	if !d.failed(policy+"min_replicas", "service.replicas", "arbiter.scale_to_zero_after_seconds") && rp.MinReplicas == 0 && a.ScaleToZeroAfterSeconds <= 0 {
		d.errorAt("arbiter.scale_to_zero_after_seconds", "arbiter.scale_to_zero_after_seconds: must be > 0 when min_replicas is 0, got %g: the service would count as idle the instant a request arrives and never leave zero", a.ScaleToZeroAfterSeconds)
	}

	// What a remote provider cannot run is refused here, not found out at launch.
	for _, l := range providerLimits {
		if !slices.ContainsFunc(a.Providers, l.uses) {
			continue
		}
		if len(s.Secrets) > 0 {
			d.errorAt("secrets", "secrets: %s", l.secrets)
		}
		if s.Workdir != "" && l.workdir != "" {
			d.errorAt("workdir", "workdir: %s", l.workdir)
		}
		for _, r := range append([]Resources{s.Resources}, append(s.Resources.AnyOf, s.Resources.Ordered...)...) {
			if r.ImageID != "" && !strings.HasPrefix(r.ImageID, l.imagePrefix) {
				d.errorAt("resources.image_id", "resources.image_id: %s: %s", quote(r.ImageID), l.image)
				break
			}
		}
	}
	// The local provider (and sim, which runs its replicas through it) runs setup and run
	// on this machine as they are: an image is not used there, which is said, not dropped.
	if p := slices.IndexFunc(a.Providers, func(p string) bool { return p == "local" || p == "sim" }); p >= 0 {
		var paths []string
		for k, v := range d.vals {
			if strings.HasPrefix(k, "resources.") && strings.HasSuffix(k, ".image_id") && v.Value != "" {
				paths = append(paths, k)
			}
		}
		slices.SortFunc(paths, func(a, b string) int { // in file order
			return cmp.Or(cmp.Compare(d.vals[a].Line, d.vals[b].Line), cmp.Compare(d.vals[a].Column, d.vals[b].Column))
		})
		for _, k := range paths {
			d.warnf(d.vals[k], "%s: has no effect on the %s provider, which runs setup and run on this machine, not in an image; what run: needs must be installed here (kubernetes and runpod start replicas from docker: images, aws boots ami- images)", k, a.Providers[p])
		}
	}
	// The aws provider passes setup, run and envs as EC2 user data, which holds 16 KiB.
	if slices.Contains(a.Providers, "aws") {
		size := len(s.Setup) + len(s.Run)
		for k, v := range s.Envs {
			size += len(k) + len(v) + len("export ='' --setenv=")
		}
		// A workdir is fetched from a presigned URL (replicas/aws.fetchWorkdir), up to
		// awsWorkdirScript bytes with a session token in it.
		if s.Workdir != "" {
			size += awsWorkdirScript
		}
		// Each S3 mount is a mkdir and a mount-s3 or aws s3 sync line (replicas/aws.s3Mounts).
		for _, m := range s.FileMounts {
			size += 2*len(m.Path) + len(m.Source) + 120
		}
		if size > awsScriptBudget {
			d.errorAt("run", "run, setup, envs and file_mounts: %d bytes; the aws provider passes them as EC2 user data, which holds 16 KiB with the script around them (at most %d of yours): move long scripts into the AMI or fetch them in setup", size, awsScriptBudget)
		}
	}

	for i, r := range a.Reserved {
		if r.Provider != "" && !slices.Contains(a.Providers, r.Provider) {
			d.errorAt("arbiter.reserved["+strconv.Itoa(i)+"].provider", "arbiter.reserved[%d].provider: %s is not in arbiter.providers (%s); add it there", i, r.Provider, strings.Join(a.Providers, ", "))
		}
	}

	// The local machine quotes no price. Beside providers that do, placement chooses among
	// offers, and local capacity enters only as the slots arbiter.reserved gives it: without
	// one, the control plane would never launch there.
	if others := slices.DeleteFunc(slices.Clone(a.Providers), func(p string) bool { return p == "local" }); len(others) < len(a.Providers) && len(others) > 0 &&
		!slices.ContainsFunc(a.Reserved, func(r ReservedCapacity) bool { return r.Provider == "local" }) {
		d.errorAt("arbiter.providers", "arbiter.providers: local beside %s: the local machine quotes no price, so placement launches there only into the slots arbiter.reserved gives it, e.g. reserved: [{provider: local, accelerator: \"A10G:1\", count: 2, price_per_hour: 0}]", strings.Join(others, ", "))
	}

	if svc.Port == 0 && !d.given("service.ports") {
		ports, path := s.Resources.Ports, "resources.ports"
		if ports == nil {
			ports, path = candidatePorts(s.Resources), "resources"
		}
		if p, ok := singlePort(ports); ok {
			svc.Port = p
		} else if len(ports) > 0 {
			d.errorAt(path, "%s: opens %s; say which port serves with service.ports", path, strings.Join(ports, ", "))
		}
	}
}

// usesSpot is use_spot as the service sees it: set in the base, or in every candidate.
func usesSpot(r Resources) bool {
	cands := r.AnyOf
	if cands == nil {
		cands = r.Ordered
	}
	if len(cands) == 0 {
		return r.UseSpot
	}
	for _, c := range cands {
		if !c.UseSpot {
			return false
		}
	}
	return true
}

// candidatePorts is the ports every candidate agrees on, when the base names none.
func candidatePorts(r Resources) []string {
	cands := r.AnyOf
	if cands == nil {
		cands = r.Ordered
	}
	if len(cands) == 0 {
		return nil
	}
	for _, c := range cands[1:] {
		if !slices.Equal(c.Ports, cands[0].Ports) {
			return nil
		}
	}
	return cands[0].Ports
}

// errorAt reports at the value given for path, or at its key.
func (d *decoder) errorAt(path, format string, args ...any) {
	var n *yaml.Node
	if v := d.vals[path]; v != nil {
		n = v
	} else {
		n = d.keys[path]
	}
	d.errorf(n, format, args...)
}

// failed reports whether a problem was already reported at the value of any of paths.
func (d *decoder) failed(paths ...string) bool {
	for _, p := range paths {
		n := d.vals[p]
		if n == nil {
			continue
		}
		for _, e := range d.errs {
			if e.Line == n.Line && e.Column == n.Column {
				return true
			}
		}
	}
	return false
}

// awsScriptBudget is what of EC2's 16 KiB of user data the spec's setup, run and envs may
// take: the aws provider's script around them takes about 1.5 KiB (replicas/aws.userData).
const awsScriptBudget = 14 << 10

// awsWorkdirScript is what the aws provider's workdir download takes of the user data: a
// presigned S3 URL (about 600 bytes; 2.2 KB with a 63-character bucket, a long prefix and
// a session token of temporary credentials: replicas/aws's TestUserDataOfTheLargestAcceptedSpecFits)
// and the lines around it.
const awsWorkdirScript = 3 << 10

// providerLimits are what the remote providers cannot run yet, and what to do instead.
var providerLimits = []struct {
	uses func(provider string) bool
	// workdir is why the provider refuses a workdir; "" where it honours one.
	secrets, workdir, imagePrefix, image string
}{
	{
		uses: IsKubernetes,
		// In a pod spec an env value is readable by anyone who may read pods; the provider
		// does not yet keep secrets in a Kubernetes Secret.
		secrets:     "the kubernetes provider does not pass secrets yet (in a pod's spec they would be readable by anyone who can read pods); put them in a Kubernetes Secret the image reads, or run this service on another provider",
		workdir:     "the kubernetes provider cannot sync a local folder into pods; build it into the image (resources.image_id: docker:IMAGE) or fetch it in setup",
		imagePrefix: "docker:",
		image:       "the kubernetes provider runs container images; write docker:IMAGE, e.g. docker:vllm/vllm-openai:latest",
	},
	{
		// Each replica is a fresh VM that boots an AMI and runs the spec from EC2 user
		// data, which anyone allowed DescribeInstanceAttribute (and any process on the VM)
		// can read (replicas/aws).
		uses:    func(p string) bool { return p == "aws" },
		secrets: "the aws provider does not pass secrets yet (in EC2 user data they would be readable by anyone allowed ec2:DescribeInstanceAttribute); give the replicas an instance profile and fetch the secret in setup (aws secretsmanager get-secret-value), or run this service on another provider",
		// workdir: packed, staged in S3 and fetched by the user data (replicas/aws).
		imagePrefix: "ami-",
		image:       "the aws provider boots AMIs (ami-…); container images on VMs are not supported yet",
	},
	{
		// Each replica is a container on a RunPod host, started from the image with the
		// spec's scripts in its environment (replicas/runpod).
		uses:        func(p string) bool { return p == "runpod" },
		secrets:     "the runpod provider does not pass secrets yet (in a pod's environment they are readable in RunPod's console and API); use a RunPod secret ({{ RUNPOD_SECRET_name }}) in envs, or run this service on another provider",
		workdir:     "the runpod provider cannot sync a local folder into pods; build it into the image (resources.image_id: docker:IMAGE) or fetch it in setup",
		imagePrefix: "docker:",
		image:       "the runpod provider runs container images; write docker:IMAGE (one without an entrypoint of its own, e.g. docker:runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04)",
	},
}

// WorkloadModel is the model shape a service's replicas serve, where the spec says it: its
// profile's model (h100-llama-3.1-8b), else the first of its model names that is a known
// shape (a Hugging Face id such as meta-llama/Llama-3.1-8B-Instruct).
func WorkloadModel(a *Arbiter) (engine.ModelShape, bool) {
	if a.Profile != "" {
		if name, err := engine.ProfileOn("h100", a.Profile); err == nil {
			if m, err := engine.LookupModel(strings.TrimPrefix(name, "h100-")); err == nil {
				return m, true
			}
		}
	}
	for _, n := range a.Models {
		if m, err := engine.LookupModel(n); err == nil {
			return m, true
		}
	}
	return engine.ModelShape{}, false
}

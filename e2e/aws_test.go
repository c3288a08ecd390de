package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/replicas/aws"
	"github.com/arbiter-serve/arbiter/replicas/aws/ec2fake"
	"github.com/arbiter-serve/arbiter/replicas/aws/s3fake"
	"github.com/arbiter-serve/arbiter/state"
)

// The aws provider end to end: the real serve binary (control plane and router) calls the
// official AWS SDK, which talks over loopback to a stateful fake of EC2's Query API
// (replicas/aws/ec2fake). Each instance boots by running its user data, whose run is
// replicasim bound to the instance's own loopback address, so the router talks to the
// "VMs" over real HTTP.

func awsSpec(model string) string {
	return `service:
  readiness_probe: {path: /health, initial_delay_seconds: 30, timeout_seconds: 2}
  replica_policy: {min_replicas: 2, max_replicas: 2, dynamic_ondemand_fallback: true}
  ports: 8000
resources:
  accelerators: A10G:1
  use_spot: true
run: exec replicasim -listen $ARBITER_HOST:$PORT -model ` + model + ` -profile h100-llama-3.2-1b -log-level warn
arbiter:
  model: ` + model + `
  providers: [aws]
  readiness: {probe_interval_seconds: 0.3, failure_threshold: 2}
`
}

// awsAccount starts a fake EC2 account (us-east-1: four zones, g5.xlarge spot prices of
// its own), writes a providers file pointing the aws provider at it, and gives the CLI
// and daemon credentials the SDK's default chain reads from the environment. With
// queue, the account has an EventBridge-fed interruption queue, the provider reads it,
// and it polls the spot requests only once an hour, so that every notice comes from the
// queue; without, the poll (every 0.5 s) is the only source.
func awsAccount(t *testing.T, c *cluster, network string, queue bool) *ec2fake.Server {
	t.Helper()
	fake, _ := awsAccountWithS3(t, c, network, queue)
	return fake
}

// awsAccountWithS3 is awsAccount with the account's fake S3 (replicas/aws/s3fake), which
// holds the bucket the providers file names for staging workdirs.
func awsAccountWithS3(t *testing.T, c *cluster, network string, queue bool) (*ec2fake.Server, *s3fake.Server) {
	t.Helper()
	s3 := s3fake.New(s3fake.Config{Buckets: []string{"arbiter-staging-e2e"}, AccessKeyID: awsTestKeyID, SecretAccessKey: awsTestSecret})
	s3srv := httptest.NewServer(s3)
	t.Cleanup(s3srv.Close)
	fake := ec2fake.New(ec2fake.Config{
		Network: network, // each test's instances on addresses of their own
		Zones: map[string][]ec2fake.Zone{"us-east-1": {{Name: "us-east-1a", ID: "use1-az4"}, {Name: "us-east-1b", ID: "use1-az6"},
			{Name: "us-east-1c", ID: "use1-az1"}, {Name: "us-east-1d", ID: "use1-az2"}}},
		SpotPrices: map[string]map[string]float64{"g5.xlarge": {"use1-az4": 0.3801, "use1-az6": 0.4102, "use1-az1": 0.3950, "use1-az2": 0.3893}},
		Images:     []ec2fake.Image{{ID: "ami-0dl", Name: "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20260901", CreationDate: "2026-09-01T00:00:00.000Z"}},
		Dir:        t.TempDir(),
		PendingFor: 500 * time.Millisecond, ShuttingDownFor: 300 * time.Millisecond, InvisibleFor: 700 * time.Millisecond,
		Env:    []string{"PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH")},
		Queues: queue,
	})
	srv := httptest.NewServer(fake)
	t.Cleanup(func() {
		srv.Close()
		fake.Close()
	})
	path := filepath.Join(c.home, "providers.yaml")
	body := fmt.Sprintf("aws:\n  regions: [us-east-1]\n  endpoint: %s\n  start_seconds: 60\n  notice_poll_seconds: 0.5\n", srv.URL)
	if queue {
		body = fmt.Sprintf("aws:\n  regions: [us-east-1]\n  endpoint: %s\n  start_seconds: 60\n  notice_poll_seconds: 3600\n"+
			"  sqs_endpoint: %[1]s\n  interruption_queues: {us-east-1: %s}\n", srv.URL, ec2fake.QueueURL("us-east-1"))
	}
	body += fmt.Sprintf("  staging_bucket: arbiter-staging-e2e\n  s3_endpoint: %s\n", s3srv.URL)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c.extraDaemonFlags = append(c.extraDaemonFlags, "--providers", path, "--zone-cooldown", "20s")
	c.env = append(c.env, "AWS_ACCESS_KEY_ID="+awsTestKeyID, "AWS_SECRET_ACCESS_KEY="+awsTestSecret, "AWS_REGION=us-east-1",
		"AWS_CONFIG_FILE=/nonexistent", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent", "AWS_EC2_METADATA_DISABLED=true")
	return fake, s3
}

const (
	awsTestKeyID  = "AKIAIOSFODNN7EXAMPLE"
	awsTestSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
)

// ownerInstances is the fake account's live instances tagged with this home's owner, by
// replica id.
func ownerInstances(t *testing.T, fake *ec2fake.Server, c *cluster) map[string]string {
	owner, err := control.ProviderOwner(c.home)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for id, tags := range fake.Live() {
		if tags[aws.TagOwner] == owner {
			out[tags[aws.TagReplica]] = id
		}
	}
	return out
}

// Two spot replicas on EC2 in its cheapest zones; one is interrupted under load while spot
// is refused in every zone: it is drained on EventBridge's warning (read from SQS) and
// replaced on-demand, with no failed request; the other is replaced on a rebalance
// recommendation, which only the queue tells; a kill -9 of the control plane right after it asked for a replica
// leaves no instance behind; serve down terminates every instance.
func TestAWSSpotLifecycle(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	fake := awsAccount(t, c, "127.0.61", true)
	const name, model = "ec2", "ec2-model"
	c.up(name, awsSpec(model))
	// No on-demand stand-in while the spot replicas start: one would start no sooner.
	c.waitFor("2 ready spot replicas on aws, and nothing else", 90*time.Second, func() bool {
		st := c.status(name)
		ready, _ := kubeReplicas(st)
		return ready["spot"] == 2 && st.Live == 2 && len(ownerInstances(t, fake, c)) == 2
	})
	st := c.status(name)
	for _, r := range st.Replicas {
		if r.State != "ready" {
			continue
		}
		if r.Provider != "aws" || r.Region != "us-east-1" || !strings.HasPrefix(r.Zone, "use1-az") || r.PricePerHour < 0.38 || r.PricePerHour > 0.42 {
			t.Errorf("replica %s: %s %s/%s at $%.4f/h; want aws at EC2's g5.xlarge spot price", r.ID, r.Provider, r.Region, r.Zone, r.PricePerHour)
		}
	}
	table := c.serve("status")
	for _, want := range []string{"aws", "us-east-1/use1-az", "spot", "0.38", "PRICED BY", "ec2:DescribeSpotPriceHistory"} {
		if !strings.Contains(table, want) {
			t.Errorf("serve status does not show %q:\n%s", want, table)
		}
	}

	streams := c.startLoad(model, 2, 40, true)
	plain := c.startLoad(model, 2, 40, false)
	time.Sleep(time.Second) // let load reach both replicas before the interruption
	for _, z := range []string{"use1-az4", "use1-az6", "use1-az1", "use1-az2"} {
		fake.RefuseCapacity("us-east-1", z, "spot", "InsufficientInstanceCapacity")
	}
	var victim state.Replica
	for _, r := range st.Replicas {
		if r.State == "ready" {
			victim = r
		}
	}
	instance := ownerInstances(t, fake, c)[victim.ID]
	interrupted := time.Now()
	if err := fake.Interrupt(instance, 4*time.Second); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the interrupted replica replaced on-demand", 90*time.Second, func() bool {
		ready, _ := kubeReplicas(c.status(name))
		return ready["spot"] == 1 && ready["on_demand"] == 1
	})
	replaced := time.Since(interrupted)
	streams.finish(t, "streams through a spot interruption")
	plain.finish(t, "requests through a spot interruption")
	logs := c.serve("logs", name)
	for _, want := range []string{"EC2 Spot Instance Interruption Warning (EventBridge)", "no capacity", "InsufficientInstanceCapacity", "priced by ec2:DescribeSpotPriceHistory", "priced by catalog:aws_skypilot_catalog_subset"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the event log does not mention %q:\n%s", want, logs)
		}
	}
	// Spot refused in one zone sends placement to the next, and only then on-demand.
	refused := map[string]bool{}
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "launch failed") && strings.Contains(line, "no capacity") {
			for _, z := range regexp.MustCompile(`use1-az\d`).FindAllString(line, -1) {
				refused[z] = true
			}
		}
	}
	if len(refused) < 2 {
		t.Errorf("spot refused in %d zones before on-demand; want the next zone tried first:\n%s", len(refused), logs)
	}
	// The interrupted instance serves until its replacement is ready and ends by EC2's
	// deadline at the latest (a replacement ready in less than the notice finds it still
	// running, draining).
	c.waitFor("the interrupted instance gone, two left", 30*time.Second, func() bool { return len(ownerInstances(t, fake, c)) == 2 })
	t.Logf("interruption to a ready on-demand replacement: %s", replaced.Round(100*time.Millisecond))

	// The spot replica left gets a rebalance recommendation: replaced before EC2 warns.
	var spotLeft string
	for _, r := range c.status(name).Replicas {
		if r.State == "ready" && r.Capacity == "spot" {
			spotLeft = r.ID
		}
	}
	if err := fake.Rebalance(ownerInstances(t, fake, c)[spotLeft]); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the replica with a rebalance recommendation replaced", 90*time.Second, func() bool {
		ready, _ := kubeReplicas(c.status(name))
		return ready["spot"] == 0 && ready["on_demand"] == 2 && len(ownerInstances(t, fake, c)) == 2
	})
	if logs := c.serve("logs", name); !strings.Contains(logs, "EC2 Instance Rebalance Recommendation (EventBridge)") {
		t.Errorf("the event log does not mention the rebalance recommendation:\n%s", logs)
	}
	if n := fake.Calls("DescribeSpotInstanceRequests"); n != 0 {
		t.Errorf("the spot requests were polled %d times: the notices must have come from the queue", n)
	}

	// kill -9 of the control plane just after it asked EC2 for a third replica: the next
	// one adopts or terminates it, and nothing is left that no row accounts for.
	for _, z := range []string{"use1-az4", "use1-az6", "use1-az1", "use1-az2"} {
		fake.RefuseCapacity("us-east-1", z, "spot", "")
	}
	runs := fake.Calls("RunInstances")
	c.serve("update", name, c.writeSpec(name, strings.Replace(awsSpec(model), "min_replicas: 2, max_replicas: 2", "min_replicas: 3, max_replicas: 3", 1)))
	c.waitFor("a launch asked of EC2", 30*time.Second, func() bool { return fake.Calls("RunInstances") > runs })
	c.kill9()
	c.startDaemon()
	c.waitFor("3 ready replicas after the restart, one instance each", 120*time.Second, func() bool {
		st := c.status(name)
		return st.Ready == 3 && len(st.Replicas) == 3 && len(ownerInstances(t, fake, c)) == 3
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if code, body, err := c.request(ctx, model); err != nil || code != 200 {
		t.Fatalf("request after the restart: %d %v %s", code, err, body)
	}
	c.serve("down", name, "--wait", "60s")
	if left := ownerInstances(t, fake, c); len(left) != 0 {
		t.Fatalf("serve down left instances: %v", left)
	}
	if strings.Contains(c.daemonLog(), awsTestSecret) {
		t.Error("the secret access key reached the daemon's log")
	}
}

// serve down --replica-id takes one replica down (by its number) and the service replaces
// it; serve down --purge removes a service whose provider is no longer configured, naming
// the instances it wrote off, which a control plane that can reach EC2 again ends. The
// service has a workdir (as SkyPilot's own serve_vectordb.yaml does) whose file its run:
// reads: staged in S3 once, fetched by every instance, replacements included.
func TestAWSReplicaDownAndPurge(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	fake, s3 := awsAccountWithS3(t, c, "127.0.66", false)
	const name, model = "purged", "purged-model"
	wd := t.TempDir()
	if err := os.WriteFile(filepath.Join(wd, "model.txt"), []byte(model+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wd, ".skyignore"), []byte("*.bin\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wd, "weights.bin"), []byte("left out"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The model name the replicas serve is read from the workdir, into which setup wrote
	// a marker run then checks: both run in ~/sky_workdir.
	spec := strings.Replace(awsSpec(model), "run: exec replicasim", "workdir: "+wd+"\nsetup: touch setup-ran\nrun: test -f setup-ran && test ! -e weights.bin && exec replicasim", 1)
	spec = strings.Replace(spec, "-model "+model, `-model "$(cat model.txt)"`, 1)

	// On a terminal, serve up shows the price and asks before launching on a paid provider.
	path := c.writeSpec(name, spec)
	args := append(append([]string{filepath.Join(binDir, "serve"), "--home", c.home, "up", "-n", name}, c.daemonFlags()...), path)
	tty := exec.Command("script", "-qec", shellJoin(args), "/dev/null")
	tty.Env = append(append(os.Environ(), c.env...), "ARBITER_HOME="+c.home)
	tty.Stdin = strings.NewReader("n\n")
	out, err := tty.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Launch? [Y/n]") || !strings.Contains(string(out), "not launched") {
		t.Fatalf("serve up on a terminal, answered n: %v\n%s", err, out)
	}
	if n := fake.Calls("RunInstances"); n != 0 {
		t.Fatalf("declined, yet %d RunInstances calls", n)
	}
	if _, ok := c.apiStatus(name); ok {
		t.Fatal("declined, yet the service exists")
	}
	// Not on a terminal (or with -y), it shows the price and launches.
	up := c.up(name, spec)
	for _, want := range []string{"Service purged on aws: min 2, max 2 replicas.", "spot      g5.xlarge (A10G:1) in aws us-east-1/use1-az4 at $0.3801/h, priced by ec2:DescribeSpotPriceHistory", "/h to start", "placement: "} {
		if !strings.Contains(up, want) {
			t.Errorf("serve up does not show %q:\n%s", want, up)
		}
	}
	if strings.Contains(up, "Launch?") {
		t.Errorf("serve up asked with no terminal to answer:\n%s", up)
	}
	c.waitFor("2 ready replicas on aws", 90*time.Second, func() bool {
		st := c.status(name)
		return st.Ready == 2 && st.Live == 2 && len(ownerInstances(t, fake, c)) == 2
	})
	var victim string
	for _, r := range c.status(name).Replicas {
		if r.State == "ready" {
			victim = r.ID
		}
	}
	number := strings.TrimPrefix(victim, name+"-")
	if out := c.serve("down", name, "--replica-id", number, "--wait", "60s"); !strings.Contains(out, "Replica "+victim+": terminated.") {
		t.Fatalf("serve down --replica-id %s:\n%s", number, out)
	}
	if _, left := ownerInstances(t, fake, c)[victim]; left {
		t.Fatalf("replica %s taken down but its instance runs", victim)
	}
	c.waitFor("a replacement", 90*time.Second, func() bool {
		st := c.status(name)
		return st.Ready == 2 && len(ownerInstances(t, fake, c)) == 2 && !strings.Contains(fmt.Sprint(st.Replicas), victim+" ")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if code, body, err := c.request(ctx, model); err != nil || code != 200 {
		t.Fatalf("a request to the model named in the workdir: %d %v %s", code, err, body)
	}
	if put, get, objs := s3.Calls("PutObject"), s3.Calls("GetObject"), s3.Objects(); put != 1 || get != 3 || len(objs) != 1 {
		t.Errorf("workdir: %d uploads (want 1), %d fetches (want 3: two replicas and a replacement), staged %d objects", put, get, len(objs))
	}
	if out, err := c.serveErr("down", name, "--replica-id", "999"); err == nil || !strings.Contains(out, "not found") {
		t.Fatalf("an unknown replica: %v\n%s", err, out)
	}

	// The daemon comes back without the aws provider: the service's replicas cannot be
	// terminated, so a plain down waits in vain, and --purge writes them off.
	c.serve("stop")
	providers := filepath.Join(c.home, "providers.yaml")
	withAWS, err := os.ReadFile(providers)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(providers, []byte("# no aws section any more\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.startDaemon()
	if out, err := c.serveErr("down", name, "--wait", "3s"); err == nil || !strings.Contains(out, "still has 2 replicas") {
		t.Fatalf("serve down without the provider: %v\n%s", err, out)
	}
	out = []byte(c.serve("down", name, "--purge", "--wait", "60s"))
	if strings.Count(string(out), "written off") != 2 || !strings.Contains(string(out), "handle us-east-1/i-") || !strings.Contains(string(out), "removed") {
		t.Fatalf("serve down --purge:\n%s", out)
	}
	if n := len(ownerInstances(t, fake, c)); n != 2 {
		t.Fatalf("%d instances after the purge; the fake EC2 still runs both", n)
	}
	// With EC2 reachable again, what no row names is ended.
	c.serve("stop")
	if err := os.WriteFile(providers, withAWS, 0o600); err != nil {
		t.Fatal(err)
	}
	c.startDaemon()
	c.waitFor("the written-off instances ended", 90*time.Second, func() bool { return len(ownerInstances(t, fake, c)) == 0 })
}

// shellJoin quotes args for sh -c.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

package aws

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/aws/ec2fake"
	"github.com/arbiter-serve/arbiter/spec"
	"gopkg.in/yaml.v3"
)

// The test binary doubles as the program the instances' user data runs: with
// envFakeReplica set it serves /health on $ARBITER_HOST:$PORT, echoing the envs a replica
// must see, until killed.
const envFakeReplica = "ARBITER_AWS_TEST_REPLICA"

func TestMain(m *testing.M) {
	if os.Getenv(envFakeReplica) != "" {
		serveFakeReplica()
		return
	}
	os.Exit(m.Run())
}

func serveFakeReplica() {
	addr := net.JoinHostPort(os.Getenv("ARBITER_HOST"), os.Getenv("PORT"))
	http.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "replica=%s service=%s model=%s gpus=%s", os.Getenv("ARBITER_REPLICA_ID"), os.Getenv("ARBITER_SERVICE"),
			os.Getenv("MODEL_NAME"), os.Getenv("SKYPILOT_NUM_GPUS_PER_NODE"))
	})
	fmt.Fprintln(os.Stderr, http.ListenAndServe(addr, nil))
	os.Exit(1)
}

// The secret the tests' credentials carry: it must never reach a log.
const testSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

type rig struct {
	fake *ec2fake.Server
	p    *Provider
	logs *syncBuffer
	exe  string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// usEast1 is the fake account's view of us-east-1: its zone names map to AZ ids its own
// way (as every account's do), and it lacks use1-az3 and use1-az5, which the catalogs price.
var usEast1 = []ec2fake.Zone{{Name: "us-east-1a", ID: "use1-az4"}, {Name: "us-east-1b", ID: "use1-az6"},
	{Name: "us-east-1c", ID: "use1-az1"}, {Name: "us-east-1d", ID: "use1-az2"}}

func newRig(t *testing.T, mod func(*ec2fake.Config, *Config)) *rig {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fcfg := ec2fake.Config{
		Zones: map[string][]ec2fake.Zone{"us-east-1": usEast1, "us-west-2": {{Name: "us-west-2a", ID: "usw2-az2"}}},
		SpotPrices: map[string]map[string]float64{
			"g5.xlarge":   {"use1-az4": 0.3801, "use1-az6": 0.4102, "use1-az1": 0.3950, "use1-az2": 0.3893},
			"p5.48xlarge": {"use1-az4": 31.5, "use1-az6": 26.25},
		},
		Images: []ec2fake.Image{
			{ID: "ami-0old", Name: "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20250101", CreationDate: "2025-01-01T00:00:00.000Z"},
			{ID: "ami-0new", Name: "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20260901", CreationDate: "2026-09-01T00:00:00.000Z"},
			{ID: "ami-0other", Name: "Ubuntu 22.04 plain", CreationDate: "2026-10-01T00:00:00.000Z"},
		},
		Dir:             t.TempDir(),
		PendingFor:      300 * time.Millisecond,
		ShuttingDownFor: 200 * time.Millisecond,
		Env:             []string{"TEST_REPLICA_BIN=" + exe},
	}
	cfg := Config{
		Account:      Account{Regions: []string{"us-east-1"}, NoticePollSeconds: 0.2},
		Owner:        "cp-test-owner",
		PollInterval: 100 * time.Millisecond,
	}
	if mod != nil {
		mod(&fcfg, &cfg)
	}
	fake := ec2fake.New(fcfg)
	srv := httptest.NewServer(fake)
	t.Cleanup(func() { srv.Close(); fake.Close() })
	cfg.Endpoint = srv.URL
	if len(cfg.InterruptionQueues) > 0 {
		cfg.SQSEndpoint = srv.URL
	}
	// Credentials come the SDK's default way, from the environment.
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", testSecret)
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true") // never reach for 169.254.169.254
	logs := &syncBuffer{}
	cfg.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if strings.Contains(logs.String(), testSecret) {
			t.Errorf("the secret access key reached the logs")
		}
	})
	return &rig{fake: fake, p: p, logs: logs, exe: exe}
}

func (r *rig) launchSpec(id string, capacity fleet.Capacity, zone string) replicas.LaunchSpec {
	return replicas.LaunchSpec{ReplicaID: id, Service: "llama", Version: 3, Capacity: capacity, Region: "us-east-1", Zone: zone,
		InstanceType: "g5.xlarge", Accelerator: "A10G", AcceleratorCount: 1, PricePerHour: ptr(0.3801), Port: 18080,
		Setup: "echo setting up > setup.marker",
		Run:   envFakeReplica + "=1 exec \"$TEST_REPLICA_BIN\"",
		Envs:  map[string]string{"MODEL_NAME": "meta-llama/Llama-3.1-8B-Instruct", "QUOTED": "it's \"quoted\" $NOT_EXPANDED"}}
}

func ptr[T any](v T) *T { return &v }

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func get(t *testing.T, addr string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica at %s never answered: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestLaunchListTerminateOnDemand(t *testing.T) {
	r := newRig(t, nil)
	ctx := ctxFor(t, time.Minute)
	ls := r.launchSpec("r-1", fleet.OnDemand, "use1-az6")
	ls.DiskGiB = 300
	in, err := r.p.Launch(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	if in.ReplicaID != "r-1" || in.Capacity != fleet.OnDemand || in.Region != "us-east-1" || in.Zone != "use1-az6" || in.PricePerHour != 0.3801 {
		t.Fatalf("instance %+v", in)
	}
	if !strings.HasPrefix(in.Address, "127.") || !strings.HasSuffix(in.Address, ":18080") {
		t.Fatalf("address %q: want the instance's private IP and the spec's port", in.Address)
	}
	// The replica runs the spec's run with its envs, after its setup.
	if got := get(t, in.Address); got != "replica=r-1 service=llama model=meta-llama/Llama-3.1-8B-Instruct gpus=1" {
		t.Fatalf("replica says %q", got)
	}
	// What the SDK sent, as EC2 reads it.
	reqs := r.fake.Requests("RunInstances")
	if len(reqs) != 1 {
		t.Fatalf("%d RunInstances calls", len(reqs))
	}
	f := reqs[0]
	for k, want := range map[string]string{
		"InstanceType": "g5.xlarge", "ImageId": "ami-0new", "Placement.AvailabilityZoneId": "use1-az6",
		"InstanceInitiatedShutdownBehavior": "terminate", "InstanceMarketOptions.MarketType": "",
		"TagSpecification.1.ResourceType": "instance", "TagSpecification.2.ResourceType": "volume",
		// resources.disk_size on the image's root device, not a second volume.
		"BlockDeviceMapping.1.DeviceName": "/dev/sda1", "BlockDeviceMapping.1.Ebs.VolumeSize": "300", "BlockDeviceMapping.1.Ebs.DeleteOnTermination": "true",
	} {
		if got := f.Get(k); got != want {
			t.Errorf("RunInstances %s = %q, want %q", k, got, want)
		}
	}
	if tok := f.Get("ClientToken"); len(tok) == 0 || len(tok) > 64 {
		t.Errorf("ClientToken %q: want 1–64 characters", tok)
	}
	ud, _ := base64.StdEncoding.DecodeString(f.Get("UserData"))
	if !strings.HasPrefix(string(ud), "#!/bin/bash\n") || !strings.Contains(string(ud), `export QUOTED='it'\''s "quoted" $NOT_EXPANDED'`) {
		t.Errorf("user data:\n%s", ud)
	}
	if strings.Contains(string(ud), testSecret) {
		t.Error("the credentials reached the user data")
	}
	live := r.fake.Live()
	if len(live) != 1 {
		t.Fatalf("live instances %v", live)
	}
	for _, tags := range live {
		for k, want := range map[string]string{TagOwner: "cp-test-owner", TagService: "llama", TagVersion: "3", TagReplica: "r-1", TagZone: "use1-az6"} {
			if tags[k] != want {
				t.Errorf("tag %s = %q, want %q", k, tags[k], want)
			}
		}
	}

	list, err := r.p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0] != in {
		t.Fatalf("List %+v, want [%+v]", list, in)
	}
	if st, _, err := r.p.Status(ctx, in.Handle); err != nil || st != replicas.StatusRunning {
		t.Fatalf("Status %s %v", st, err)
	}
	if err := r.p.Terminate(ctx, in.Handle); err != nil {
		t.Fatal(err)
	}
	if st, reason, err := r.p.Status(ctx, in.Handle); err != nil || st != replicas.StatusGone || !strings.Contains(reason, "UserInitiatedShutdown") {
		t.Fatalf("after Terminate: Status %s %q %v", st, reason, err)
	}
	if err := r.p.Terminate(ctx, in.Handle); err != nil {
		t.Fatalf("Terminate is idempotent: %v", err)
	}
	if list, err := r.p.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("List after Terminate: %v %v", list, err)
	}
	if _, err := http.Get("http://" + in.Address + "/health"); err == nil {
		t.Fatal("the replica still answers after its instance terminated")
	}
}

// List follows pages and finds only this owner's instances: a second control plane's (or
// anyone's) in the same account are not ours to adopt or terminate.
func TestListFindsOnlyThisOwnersInstancesAcrossPages(t *testing.T) {
	r := newRig(t, nil)
	ctx := ctxFor(t, 2*time.Minute)
	other, err := New(ctx, Config{Account: Account{Regions: []string{"us-east-1"}, Endpoint: r.p.cfg.Endpoint}, Owner: "someone-else",
		PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 9)
	for i := range 7 { // more than a page (5)
		wg.Go(func() {
			_, err := r.p.Launch(ctx, r.launchSpec(fmt.Sprintf("mine-%d", i), fleet.OnDemand, "use1-az4"))
			errs <- err
		})
	}
	for i := range 2 {
		wg.Go(func() {
			_, err := other.Launch(ctx, r.launchSpec(fmt.Sprintf("theirs-%d", i), fleet.OnDemand, "use1-az4"))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	list, err := r.p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 7 {
		t.Fatalf("List found %d instances, want this owner's 7: %+v", len(list), list)
	}
	for _, in := range list {
		if !strings.HasPrefix(in.ReplicaID, "mine-") {
			t.Fatalf("List found %s, another owner's", in.ReplicaID)
		}
	}
	if n := r.fake.Calls("DescribeInstances"); n < 2 {
		t.Fatalf("DescribeInstances called %d times", n)
	}
}

func TestSpotInterruptionIsANoticeThenGone(t *testing.T) {
	r := newRig(t, nil)
	ctx := ctxFor(t, time.Minute)
	ls := r.launchSpec("s-1", fleet.Spot, "use1-az4")
	ls.Image = "ami-0old" // resources.image_id outranks the account's image
	in, err := r.p.Launch(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	f := r.fake.Requests("RunInstances")[0]
	for k, want := range map[string]string{"ImageId": "ami-0old", "InstanceMarketOptions.MarketType": "spot", "InstanceMarketOptions.SpotOptions.SpotInstanceType": "one-time",
		"InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior": "terminate", "TagSpecification.3.ResourceType": "spot-instances-request"} {
		if got := f.Get(k); got != want {
			t.Errorf("RunInstances %s = %q, want %q", k, got, want)
		}
	}
	if in.Capacity != fleet.Spot {
		t.Fatalf("capacity %s", in.Capacity)
	}
	_, id, _ := splitHandle(in.Handle)
	before := time.Now()
	if err := r.fake.Interrupt(id, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-r.p.Notices():
		if n.ReplicaID != "s-1" || n.Handle != in.Handle || !strings.HasPrefix(n.Reason, "marked-for-termination") {
			t.Fatalf("notice %+v", n)
		}
		if d := n.Deadline.Sub(before); d < 100*time.Second || d > 130*time.Second {
			t.Fatalf("deadline %s after the notice: want EC2's two minutes", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no interruption notice")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, reason, err := r.p.Status(ctx, in.Handle)
		if err != nil {
			t.Fatal(err)
		}
		if st == replicas.StatusGone {
			if !strings.Contains(reason, "Server.SpotInstanceTermination") {
				t.Fatalf("gone for %q", reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the interrupted instance never went")
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case n := <-r.p.Notices():
		t.Fatalf("a second notice for one interruption: %+v", n)
	case <-time.After(500 * time.Millisecond):
	}
}

// A zone without capacity is ErrNoCapacity (placement tries the next zone, then
// on-demand); a quota or refused credentials are said as such, and are not.
func TestLaunchErrorsAreClassified(t *testing.T) {
	r := newRig(t, nil)
	ctx := ctxFor(t, time.Minute)
	for _, code := range []string{"InsufficientInstanceCapacity", "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow"} {
		r.fake.RefuseCapacity("us-east-1", "use1-az4", "spot", code)
		_, err := r.p.Launch(ctx, r.launchSpec("c-"+code, fleet.Spot, "use1-az4"))
		if !errors.Is(err, replicas.ErrNoCapacity) || !strings.Contains(err.Error(), code) {
			t.Fatalf("%s: %v: want ErrNoCapacity naming the code", code, err)
		}
	}
	// A refusal is not retried by the SDK: the zone has no capacity now.
	if n := r.fake.Calls("RunInstances"); n != 3 {
		t.Errorf("RunInstances called %d times for 3 refused launches: capacity refusals were retried", n)
	}
	// Spot where EC2 has no spot market for the type: Unsupported, also not here.
	if _, err := r.p.Launch(ctx, replicas.LaunchSpec{ReplicaID: "u", Service: "s", Capacity: fleet.Spot, Region: "us-east-1", Zone: "use1-az1",
		InstanceType: "p5.48xlarge", Run: "true"}); !errors.Is(err, replicas.ErrNoCapacity) {
		t.Fatalf("Unsupported: %v", err)
	}
	// The next zone still launches.
	if _, err := r.p.Launch(ctx, r.launchSpec("c-next", fleet.Spot, "use1-az6")); err != nil {
		t.Fatalf("next zone: %v", err)
	}
	r.fake.Quota("VcpuLimitExceeded")
	_, err := r.p.Launch(ctx, r.launchSpec("q", fleet.OnDemand, "use1-az6"))
	if err == nil || errors.Is(err, replicas.ErrNoCapacity) || !strings.Contains(err.Error(), "quota") {
		t.Fatalf("quota: %v", err)
	}
	r.fake.Quota("")
	if got := len(r.fake.Live()); got != 1 {
		t.Fatalf("%d live instances, want the one that launched", got)
	}
}

// Throttling is retried with the SDK's backoff; a RunInstances whose answer is lost is
// asked again with the same client token and makes one instance, not two.
func TestThrottlingAndLostAnswersMakeOneInstance(t *testing.T) {
	r := newRig(t, nil)
	ctx := ctxFor(t, time.Minute)
	r.fake.Throttle(2)
	r.fake.DropReplies("RunInstances", 1)
	in, err := r.p.Launch(ctx, r.launchSpec("t-1", fleet.OnDemand, "use1-az6"))
	if err != nil {
		t.Fatal(err)
	}
	if n := r.fake.Calls("RunInstances"); n < 2 {
		t.Fatalf("RunInstances called %d times: the lost answer was not asked again", n)
	}
	if live := r.fake.Live(); len(live) != 1 {
		t.Fatalf("%d instances for one replica: %v", len(live), live)
	}
	// A control plane that crashed mid-launch and launches the same replica again gets
	// the same instance.
	again, err := r.p.Launch(ctx, r.launchSpec("t-1", fleet.OnDemand, "use1-az6"))
	if err != nil || again.Handle != in.Handle {
		t.Fatalf("relaunch: %+v %v, want %s", again, err, in.Handle)
	}
	if live := r.fake.Live(); len(live) != 1 {
		t.Fatalf("%d instances after a relaunch", len(live))
	}
}

// EC2 may not list an instance it has just created; that is not the instance gone.
func TestJustCreatedInstanceIsNotGone(t *testing.T) {
	r := newRig(t, func(f *ec2fake.Config, _ *Config) {
		f.InvisibleFor = 1500 * time.Millisecond
		f.PendingFor = 2 * time.Second
	})
	ctx := ctxFor(t, time.Minute)
	done := make(chan error, 1)
	var in replicas.Instance
	go func() {
		var err error
		in, err = r.p.Launch(ctx, r.launchSpec("e-1", fleet.OnDemand, "use1-az6"))
		done <- err
	}()
	// While it is invisible, List (a restarted control plane) does not find it, and the
	// launch is still waiting rather than failed.
	deadline := time.Now().Add(10 * time.Second)
	for r.fake.Calls("DescribeInstances") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Launch never described its instance")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("Launch ended while its instance was still invisible: %v", err)
	default:
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st, _, err := r.p.Status(ctx, in.Handle); st != replicas.StatusRunning || err != nil {
		t.Fatalf("Status %s %v", st, err)
	}
}

// A launch that does not reach running in time terminates its instance before it says so.
func TestSlowLaunchLeavesNoInstance(t *testing.T) {
	r := newRig(t, func(f *ec2fake.Config, c *Config) { f.PendingFor = time.Hour; c.StartSeconds = 1 })
	ctx := ctxFor(t, time.Minute)
	if _, err := r.p.Launch(ctx, r.launchSpec("slow", fleet.OnDemand, "use1-az6")); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("slow launch: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(r.fake.Live()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v", r.fake.Live())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestQuotePricesSpotFromEC2AndSkipsZonesTheAccountLacks(t *testing.T) {
	r := newRig(t, nil)
	ctx := ctxFor(t, time.Minute)
	sp := &spec.Service{Name: "llama", Resources: spec.Resources{Accelerators: []spec.Accelerator{{Name: "A10G", Count: 1}}, UseSpot: true}}
	qs, err := r.p.Quote(ctx, "llama", sp)
	if err != nil {
		t.Fatal(err)
	}
	spot, onDemand := map[string]float64{}, map[string]float64{}
	for _, q := range qs {
		if q.Provider != "aws" || q.Region != "us-east-1" || q.Accelerator != "A10G" || q.AcceleratorCount != 1 {
			t.Fatalf("quote %+v", q)
		}
		if q.InstanceType != "g5.xlarge" { // larger hosts with one A10G: priced alike
			if q.Capacity == fleet.Spot {
				t.Errorf("spot quote %+v: EC2 has no spot price for it", q)
			}
			continue
		}
		switch q.Capacity {
		case fleet.Spot:
			if q.PriceSource != SourceSpotPriceHistory {
				t.Errorf("spot quote priced by %q", q.PriceSource)
			}
			spot[q.Zone] = q.PricePerHour
		case fleet.OnDemand:
			if !strings.HasPrefix(q.PriceSource, "catalog:") {
				t.Errorf("on-demand quote priced by %q", q.PriceSource)
			}
			onDemand[q.Zone] = q.PricePerHour
		}
	}
	// EC2's prices now, in the four zones this account has (not use1-az5, which the
	// catalog prices at 0.4028).
	want := map[string]float64{"use1-az4": 0.3801, "use1-az6": 0.4102, "use1-az1": 0.3950, "use1-az2": 0.3893}
	if fmt.Sprint(spot) != fmt.Sprint(want) {
		t.Fatalf("spot quotes %v, want %v", spot, want)
	}
	if len(onDemand) != 4 || onDemand["use1-az4"] != 1.006 {
		t.Fatalf("on-demand quotes %v: want the catalog's 1.006 in the account's 4 zones", onDemand)
	}
	// Cached: a second quote asks EC2 nothing.
	n := r.fake.Calls("DescribeSpotPriceHistory") + r.fake.Calls("DescribeAvailabilityZones")
	if _, err := r.p.Quote(ctx, "llama", sp); err != nil {
		t.Fatal(err)
	}
	if m := r.fake.Calls("DescribeSpotPriceHistory") + r.fake.Calls("DescribeAvailabilityZones"); m != n {
		t.Fatalf("a second quote made %d calls", m-n)
	}
	// Resources another cloud serves are not aws offers.
	if _, err := r.p.Quote(ctx, "g", &spec.Service{Resources: spec.Resources{Accelerators: []spec.Accelerator{{Name: "A10G", Count: 1}}, Cloud: "gcp"}}); err == nil {
		t.Fatal("quoted resources pinned to gcp")
	}
}

func TestAccountChecks(t *testing.T) {
	for _, a := range []Account{{Regions: []string{"us east 1"}}, {Endpoint: "ftp://x"}, {StartSeconds: -1}, {Image: "ami-0 *"},
		{SQSEndpoint: "127.0.0.1:9"}, {InterruptionQueues: map[string]string{"us-east-1": "arbiter-interruptions"}},
		{Regions: []string{"us-east-1"}, InterruptionQueues: map[string]string{"us-west-2": ec2fake.QueueURL("us-west-2")}},
		{StagingBucket: "s3://arbiter-staging"}, {StagingBucket: "Arbiter_Staging"}, {StagingPrefix: "/abs/"}, {StagingRegion: "east"}, {S3Endpoint: "s3.local"}} {
		if err := a.Check(); err == nil {
			t.Errorf("%+v accepted", a)
		}
	}
	if err := (&Account{Regions: []string{"us-east-1", "eu-central-1"}, Endpoint: "http://127.0.0.1:1",
		InterruptionQueues: map[string]string{"eu-central-1": ec2fake.QueueURL("eu-central-1")},
		StagingBucket:      "arbiter-staging.example", StagingPrefix: "team/workdirs/", StagingRegion: "eu-central-1", S3Endpoint: "http://127.0.0.1:2"}).Check(); err != nil {
		t.Fatal(err)
	}
}

// What serve validate accepts must launch: a spec at the edge of spec's user-data budget
// makes a script EC2 takes (16 KiB).
func TestUserDataOfTheLargestAcceptedSpecFits(t *testing.T) {
	var envs strings.Builder
	size := 0
	for i := range 40 {
		k, v := fmt.Sprintf("VAR_%02d", i), strings.Repeat("v", 40)
		fmt.Fprintf(&envs, "  %s: %s\n", k, v)
		size += len(k) + len(v) + len("export ='' --setenv=")
	}
	setup := "echo setup"
	run := strings.Repeat("x", 14<<10-size-len(setup))
	src := "setup: " + setup + "\nrun: " + run + "\nenvs:\n" + envs.String() + "service:\n  readiness_probe: /health\narbiter: {providers: [aws]}\n"
	sp, err := spec.Parse("svc.yaml", []byte(src))
	if err != nil {
		t.Fatalf("the spec at the budget is refused: %v", err)
	}
	ls := replicas.LaunchSpec{ReplicaID: strings.Repeat("r", 64), Service: strings.Repeat("s", 63), Version: 99999, Setup: sp.Setup, Run: sp.Run,
		Envs: sp.Envs, AcceleratorCount: 8}
	ud, err := userData(ls, 65535, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ud) > maxUserData {
		t.Fatalf("user data %d bytes > %d", len(ud), maxUserData)
	}
	if _, err := spec.Parse("svc.yaml", []byte(strings.Replace(src, "run: ", "run: xx", 1))); err == nil {
		t.Fatal("a spec past the budget is accepted")
	}

	// With a workdir: its presigned URL, signed with temporary credentials (a session
	// token of 1,200 characters, larger than STS's usual), fits in the room spec leaves.
	wsrc := "workdir: /srv/app\n" + strings.Replace(src, "run: "+run, "run: "+run[:len(run)-3<<10], 1)
	wsp, err := spec.Parse("svc.yaml", []byte(wsrc))
	if err != nil {
		t.Fatalf("the spec with a workdir at the budget is refused: %v", err)
	}
	if _, err := spec.Parse("svc.yaml", []byte(strings.Replace(wsrc, "run: ", "run: xx", 1))); err == nil {
		t.Fatal("a spec with a workdir past the budget is accepted")
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "ASIAIOSFODNN7EXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", testSecret)
	t.Setenv("AWS_SESSION_TOKEN", strings.Repeat("IQoJb3JpZ2luX2VjE+/=", 60))
	t.Setenv("AWS_REGION", "ap-southeast-2")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	p, err := New(ctxFor(t, time.Minute), Config{Owner: "o", Account: Account{StagingBucket: strings.Repeat("b", 63), StagingPrefix: strings.Repeat("p", 100) + "/"}})
	if err != nil {
		t.Fatal(err)
	}
	p.staged[ls.Service+"\x00"+fmt.Sprint(ls.Version)+"\x00/srv/app"] = stagedWorkdir{key: p.cfg.StagingPrefix + strings.Repeat("f", 64) + ".tar.gz", sha256: strings.Repeat("f", 64)}
	ls.Workdir, ls.Setup, ls.Run = "/srv/app", wsp.Setup, wsp.Run
	wd, err := p.workdirFor(context.Background(), ls)
	if err != nil {
		t.Fatal(err)
	}
	ud, err = userData(ls, 65535, 0, wd)
	if err != nil {
		t.Fatal(err)
	}
	if len(ud) > maxUserData || !strings.Contains(ud, "X-Amz-Security-Token=") {
		t.Fatalf("user data %d bytes > %d, or no session token in its URL", len(ud), maxUserData)
	}
	t.Logf("the largest accepted spec with a workdir: %d bytes of user data, %d of them the presigned URL", len(ud), len(wd.url))
}

// withQueue gives the rig's account an EventBridge-fed interruption queue in us-east-1
// and the provider its URL, with the spot requests' poll slowed to once an hour, so that
// what the provider hears, it hears from the queue.
func withQueue(f *ec2fake.Config, c *Config) {
	f.Queues = true
	c.InterruptionQueues = map[string]string{"us-east-1": ec2fake.QueueURL("us-east-1")}
	c.NoticePollSeconds = 3600
}

// EventBridge's interruption warning and rebalance recommendation, read from SQS, are
// notices at once, one per instance whichever comes first; messages that are not EC2's
// events or not about this owner's replicas are deleted, not read forever.
func TestQueuedEventsAreNotices(t *testing.T) {
	r := newRig(t, withQueue)
	ctx := ctxFor(t, time.Minute)
	r.fake.Send("us-east-1", "{not json")
	r.fake.Send("us-east-1", `{"version":"0","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","region":"us-east-1","time":"2026-11-26T00:00:00Z","detail":{"instance-id":"i-0someoneelses","instance-action":"terminate"}}`)
	a, err := r.p.Launch(ctx, r.launchSpec("q-1", fleet.Spot, "use1-az4"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.p.Launch(ctx, r.launchSpec("q-2", fleet.Spot, "use1-az6"))
	if err != nil {
		t.Fatal(err)
	}
	next := func(what string) replicas.Notice {
		t.Helper()
		select {
		case n := <-r.p.Notices():
			return n
		case <-time.After(20 * time.Second):
			t.Fatalf("no notice for %s", what)
		}
		return replicas.Notice{}
	}
	_, ida, _ := splitHandle(a.Handle)
	before := time.Now()
	if err := r.fake.Interrupt(ida, time.Minute); err != nil {
		t.Fatal(err)
	}
	n := next("the interruption warning")
	if n.ReplicaID != "q-1" || n.Handle != a.Handle || !strings.Contains(n.Reason, "Interruption Warning") {
		t.Fatalf("notice %+v", n)
	}
	// The event's time has whole seconds.
	if d := n.Deadline.Sub(before); d < 115*time.Second || d > 125*time.Second {
		t.Fatalf("deadline %s after the warning: want EC2's two minutes", d)
	}
	_, idb, _ := splitHandle(b.Handle)
	if err := r.fake.Rebalance(idb); err != nil {
		t.Fatal(err)
	}
	if n := next("the rebalance recommendation"); n.ReplicaID != "q-2" || !strings.Contains(n.Reason, "Rebalance Recommendation") {
		t.Fatalf("notice %+v", n)
	}
	// The warning that follows a recommendation is not a second notice.
	if err := r.fake.Interrupt(idb, time.Minute); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for r.fake.Queued("us-east-1") > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d messages left on the queue", r.fake.Queued("us-east-1"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case n := <-r.p.Notices():
		t.Fatalf("a second notice: %+v", n)
	case <-time.After(300 * time.Millisecond):
	}
	if c := r.fake.Calls("DescribeSpotInstanceRequests"); c != 0 {
		t.Fatalf("the spot requests were polled %d times: the notices must have come from the queue", c)
	}
	if !strings.Contains(r.logs.String(), "not an EC2 event") {
		t.Fatalf("the unreadable message was not reported:\n%s", r.logs.String())
	}
}

// deploy/aws/interruption-queue.yaml routes exactly the events the provider acts on to a
// queue whose name the IAM policy lets it read.
func TestInterruptionQueueTemplateMatchesTheProvider(t *testing.T) {
	b, err := os.ReadFile("../../deploy/aws/interruption-queue.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tmpl struct {
		Parameters struct {
			QueueName struct {
				Default        string `yaml:"Default"`
				AllowedPattern string `yaml:"AllowedPattern"`
			} `yaml:"QueueName"`
		} `yaml:"Parameters"`
		Resources map[string]struct {
			Type       string `yaml:"Type"`
			Properties struct {
				EventPattern struct {
					Source     []string `yaml:"source"`
					DetailType []string `yaml:"detail-type"`
				} `yaml:"EventPattern"`
				Targets []struct {
					Arn map[string][]string `yaml:"Arn"`
				} `yaml:"Targets"`
			} `yaml:"Properties"`
		} `yaml:"Resources"`
	}
	if err := yaml.Unmarshal(b, &tmpl); err != nil {
		t.Fatal(err)
	}
	routed := map[string]bool{}
	for name, r := range tmpl.Resources {
		if r.Type != "AWS::Events::Rule" {
			continue
		}
		if !slices.Equal(r.Properties.EventPattern.Source, []string{"aws.ec2"}) || len(r.Properties.Targets) != 1 ||
			!slices.Equal(r.Properties.Targets[0].Arn["Fn::GetAtt"], []string{"Queue", "Arn"}) {
			t.Errorf("rule %s: %+v", name, r.Properties)
		}
		for _, d := range r.Properties.EventPattern.DetailType {
			routed[d] = true
		}
	}
	if len(routed) != 2 || !routed[interruptionWarning] || !routed[rebalanceRecommendation] {
		t.Errorf("the rules route %v; the provider acts on %q and %q", slices.Sorted(maps.Keys(routed)), interruptionWarning, rebalanceRecommendation)
	}
	if tmpl.Resources["Queue"].Type != "AWS::SQS::Queue" {
		t.Fatal("no queue")
	}
	policy, err := os.ReadFile("../../deploy/aws/iam-policy.json")
	if err != nil {
		t.Fatal(err)
	}
	const granted = "arn:aws:sqs:*:*:arbiter-interruptions*"
	if !strings.Contains(string(policy), granted) || !strings.HasPrefix(tmpl.Parameters.QueueName.Default, "arbiter-interruptions") ||
		!strings.HasPrefix(tmpl.Parameters.QueueName.AllowedPattern, "arbiter-interruptions") {
		t.Errorf("the queue's name (%+v) is not one the IAM policy grants (%s)", tmpl.Parameters.QueueName, granted)
	}
}

// A queue that cannot be read is reported, and the spot requests' poll still gives the
// notice.
func TestMissingQueueFallsBackToPolling(t *testing.T) {
	r := newRig(t, func(f *ec2fake.Config, c *Config) {
		withQueue(f, c)
		c.InterruptionQueues["us-east-1"] = "https://sqs.us-east-1.amazonaws.com/123456789012/no-such-queue"
		c.NoticePollSeconds = 0.2
	})
	ctx := ctxFor(t, time.Minute)
	in, err := r.p.Launch(ctx, r.launchSpec("m-1", fleet.Spot, "use1-az4"))
	if err != nil {
		t.Fatal(err)
	}
	_, id, _ := splitHandle(in.Handle)
	if err := r.fake.Interrupt(id, time.Minute); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-r.p.Notices():
		if !strings.HasPrefix(n.Reason, "marked-for-termination") {
			t.Fatalf("notice %+v", n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no notice")
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(r.logs.String(), "NonExistentQueue") {
		if time.Now().After(deadline) {
			t.Fatalf("the missing queue was not reported:\n%s", r.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// deploy/aws/iam-policy.json grants every EC2 action the provider calls in a whole life
// cycle (quote, spot launch, list, interruption notice, terminate), so an operator who
// attaches it is not refused half way.
func TestIAMPolicyGrantsEveryActionCalled(t *testing.T) {
	r := newRig(t, func(f *ec2fake.Config, c *Config) { withQueue(f, c); c.NoticePollSeconds = 0.2 })
	ctx := ctxFor(t, time.Minute)
	sp := &spec.Service{Resources: spec.Resources{Accelerators: []spec.Accelerator{{Name: "A10G", Count: 1}}, UseSpot: true}}
	if _, err := r.p.Quote(ctx, "llama", sp); err != nil {
		t.Fatal(err)
	}
	in, err := r.p.Launch(ctx, r.launchSpec("iam", fleet.Spot, "use1-az4"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.p.List(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.fake.Calls("DescribeSpotInstanceRequests") == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	_, id, _ := splitHandle(in.Handle)
	if err := r.fake.Rebalance(id); err != nil { // read from the queue, then deleted
		t.Fatal(err)
	}
	for r.fake.Calls("sqs:DeleteMessage") == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := r.p.Terminate(ctx, in.Handle); err != nil {
		t.Fatal(err)
	}
	granted := grantedActions(t)
	called := r.fake.Actions()
	if len(called) < 9 {
		t.Fatalf("only %v were called", called)
	}
	for _, a := range called {
		if !strings.Contains(a, ":") {
			a = "ec2:" + a
		}
		if !granted[a] {
			t.Errorf("the provider calls %s, which deploy/aws/iam-policy.json does not grant", a)
		}
	}
}

// grantedActions is every action deploy/aws/iam-policy.json allows (on some resource).
func grantedActions(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../../deploy/aws/iam-policy.json")
	if err != nil {
		t.Fatal(err)
	}
	var policy struct {
		Statement []struct {
			Effect string
			Action any
		}
	}
	if err := json.Unmarshal(b, &policy); err != nil {
		t.Fatal(err)
	}
	granted := map[string]bool{}
	for _, st := range policy.Statement {
		if st.Effect != "Allow" {
			continue
		}
		switch a := st.Action.(type) {
		case string:
			granted[a] = true
		case []any:
			for _, v := range a {
				granted[v.(string)] = true
			}
		}
	}
	return granted
}

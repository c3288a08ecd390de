package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/picker"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
)

// TestKubernetesGatewayPickerFromInferencePool runs the endpoint picker (cmd/picker) on an
// InferencePool of a real kube-apiserver and kube-scheduler, as the picker's own
// ServiceAccount with deploy/kubernetes/gateway's RBAC. The pool's pods run replicasim, one
// on a node labelled as a Karpenter L4 spot node and one on a GKE H100 on-demand node; a Go
// ext_proc client replays what Envoy sends and forwards each request to the pick over real
// HTTP. The pick is the L4 spot pod (cheapest, meeting the SLO); a pod turned unready or
// deleted is no longer offered; a new ready pod on a new L4 spot node is picked; a selector
// that matches nothing is said in the picker's log; a second picker on the same pool picks
// the same; started before the InferencePool CRD exists, the picker says so and then serves.
func TestKubernetesGatewayPickerFromInferencePool(t *testing.T) {
	k := startKube(t, "gwpick", "127.0.59.1/24")
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := k.Kubectl(args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	apply := func(name, yaml string) {
		t.Helper()
		path := filepath.Join(t.TempDir(), name+".yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		kubectl("apply", "-f", path)
	}
	kubectl("apply", "-f", filepath.Join("..", "deploy", "kubernetes", "gateway", "rbac.yaml"))
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(k.Dir, "pods", "arbiter_*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", filepath.Base(l), b)
			}
		}
	})
	kubeconfig := k.ServiceAccountKubeconfig("arbiter", "arbiter-picker")

	// Started before GIE's CRD is installed: the picker says what is missing, and picks up
	// the pool once it is there.
	pa := startPicker(t, kubeconfig)
	waitLog(t, pa, "is GIE's InferencePool CRD (inference.networking.k8s.io/v1) installed?")
	kubectl("apply", "-f", filepath.Join("testdata", "gateway-crds"))
	kubectl("wait", "--for=condition=Established", "--timeout=120s", "crd/inferencepools.inference.networking.k8s.io")
	k.AddNode(kubetest.KarpenterNode("l4-spot-a", "gpu", "us-east-1a", "spot", false))
	k.AddNode(kubetest.GKENode("h100-od", "us-central1", "us-central1-a", false, 1))

	// The pool first, selecting no pod yet: the picker says so and serves nothing.
	apply("pool", `apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: sims, namespace: arbiter}
spec:
  selector: {matchLabels: {app: sim}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: arbiter-picker, port: {number: 9002}}
`)
	waitLog(t, pa, "its selector app=sim matches no pod in namespace arbiter")

	pod := func(name, node string) {
		t.Helper()
		apply(name, `apiVersion: v1
kind: Pod
metadata: {name: `+name+`, namespace: arbiter, labels: {app: sim}}
spec:
  nodeSelector: {kubernetes.io/hostname: `+node+`}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  containers:
    - name: vllm
      image: ghcr.io/arbiter-serve/replicasim:test
      command: [`+filepath.Join(binDir, "replicasim")+`, -listen, "$(POD_IP):8000", -model, sim, -profile, h100-llama-3.1-8b, -log-level, warn]
      env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
      resources: {limits: {nvidia.com/gpu: 1}}
`)
	}
	addrOf := func(name string) string {
		t.Helper()
		var ip string
		deadline := time.Now().Add(2 * time.Minute)
		for ip == "" {
			for _, p := range k.Pods("arbiter", "app=sim") {
				if p.Name == name && p.Status.PodIP != "" {
					ip = p.Status.PodIP
				}
			}
			if ip == "" && time.Now().After(deadline) {
				t.Fatalf("pod %s got no IP", name)
			}
			time.Sleep(200 * time.Millisecond)
		}
		return ip + ":8000"
	}
	pod("sim-l4", "l4-spot-a")
	pod("sim-h100", "h100-od")
	l4, h100 := addrOf("sim-l4"), addrOf("sim-h100")

	// The cheapest endpoint that meets the SLO: the L4 on spot, over the H100 on demand.
	pickUntil(t, pa, "the L4 spot pod picked", func(dest []string) bool { return dest[0] == l4 })
	for i := range 5 {
		if got := gatewayCall(t, pa); got.dest[0] != l4 || got.status != http.StatusOK {
			t.Fatalf("request %d: picked %v (status %d %s), want %s (the L4 spot pod) first", i, got.dest, got.status, got.body, l4)
		}
	}

	// The L4 pod turning unready (its Ready condition false, as a kubelet sets it when the
	// readiness probe fails): no longer offered; ready again: picked again.
	setReady := func(name string, ready bool) {
		t.Helper()
		kubectl("patch", "pod", name, "-n", "arbiter", "--subresource=status", "-p",
			fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":%q}]}}`, map[bool]string{true: "True", false: "False"}[ready]))
	}
	setReady("sim-l4", false)
	pickUntil(t, pa, "the unready L4 pod no longer offered", func(dest []string) bool { return !strings.Contains(strings.Join(dest, ","), l4) })
	setReady("sim-l4", true)
	pickUntil(t, pa, "the L4 pod picked once ready again", func(dest []string) bool { return dest[0] == l4 })

	// A second picker on the same pool sees the same endpoints, priced the same: the same pick.
	pb := startPicker(t, kubeconfig)
	pickUntil(t, pb, "the second picker picking the L4 spot pod", func(dest []string) bool { return dest[0] == l4 })

	// The L4 pod deleted: no longer offered at all; the H100 pod takes the requests.
	kubectl("delete", "pod", "-n", "arbiter", "sim-l4", "--wait=false")
	pickUntil(t, pa, "the deleted pod no longer offered", func(dest []string) bool { return !strings.Contains(strings.Join(dest, ","), l4) })
	if got := gatewayCall(t, pa); got.dest[0] != h100 || got.status != http.StatusOK {
		t.Fatalf("with the L4 pod gone: picked %v (status %d %s), want %s", got.dest, got.status, got.body, h100)
	}

	// A new ready pod on a new L4 spot node: picked, without a restart.
	k.AddNode(kubetest.KarpenterNode("l4-spot-b", "gpu", "us-east-1b", "spot", false))
	pod("sim-l4-b", "l4-spot-b")
	l4b := addrOf("sim-l4-b")
	pickUntil(t, pa, "the new L4 spot pod picked", func(dest []string) bool { return dest[0] == l4b })
	pickUntil(t, pb, "the new L4 spot pod picked by the second picker", func(dest []string) bool { return dest[0] == l4b })

	// Active-passive (-leader-elect): of two pickers on the pool, only the Lease's holder
	// reports ready; the holder killed (no release: SIGKILL), the other takes over once the
	// Lease (15 s, client-go's and GIE's default) runs out, and picks as the first did.
	kubectl("apply", "-f", filepath.Join("..", "deploy", "kubernetes", "gateway", "leader-election.yaml"))
	pc := startPicker(t, kubeconfig, "-pool-name", "sims", "-model", "sim", "-leader-elect")
	pd := startPicker(t, kubeconfig, "-pool-name", "sims", "-model", "sim", "-leader-elect")
	ready := func(p *pickerProc) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := p.health.Check(ctx, &healthpb.HealthCheckRequest{Service: picker.ReadinessService})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}
	var holder, standby *pickerProc
	for deadline := time.Now().Add(time.Minute); holder == nil; time.Sleep(200 * time.Millisecond) {
		switch rc, rd := ready(pc), ready(pd); {
		case rc && rd:
			t.Fatal("both pickers ready under -leader-elect")
		case rc:
			holder, standby = pc, pd
		case rd:
			holder, standby = pd, pc
		}
		if holder == nil && time.Now().After(deadline) {
			t.Fatal("no picker became the Lease's holder within a minute")
		}
	}
	// The standby stays not ready while the holder renews.
	for range 10 {
		if ready(standby) {
			t.Fatal("the standby picker reported ready while the holder renews")
		}
		time.Sleep(500 * time.Millisecond)
	}
	pickUntil(t, holder, "the holder picking the L4 spot pod", func(dest []string) bool { return dest[0] == l4b })
	killed := time.Now()
	_ = holder.cmd.Process.Kill()
	for !ready(standby) {
		if time.Since(killed) > time.Minute {
			t.Fatal("the standby picker did not take over within a minute of the holder's death")
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("takeover %.1f s after the holder was killed (Lease 15 s)", time.Since(killed).Seconds())
	pickUntil(t, standby, "the new holder picking the L4 spot pod", func(dest []string) bool { return dest[0] == l4b })
}

// pickerProc is a running cmd/picker and an ext_proc client of it.
type pickerProc struct {
	cmd    *exec.Cmd
	client extprocv3.ExternalProcessorClient
	health healthpb.HealthClient
	admin  string // http://host:port of its admin port (/replicas)
	model  string // the model its requests ask for
	mu     sync.Mutex
	log    bytes.Buffer
}

func (p *pickerProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Write(b)
}

func (p *pickerProc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func startPicker(t *testing.T, kubeconfig string, args ...string) *pickerProc {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "router.yaml")
	if err := os.WriteFile(cfg, []byte("probe: {interval: 200ms}\nscrape_interval: 200ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := &pickerProc{admin: "http://" + freeAddr(t), model: "sim"}
	if len(args) == 0 {
		args = []string{"-pool-name", "sims", "-model", "sim"}
	}
	for i, a := range args {
		if a == "-model" && i+1 < len(args) {
			p.model = args[i+1]
		}
	}
	cmd := exec.Command(filepath.Join(binDir, "picker"), append([]string{"-pool-namespace", "arbiter", "-kubeconfig", kubeconfig,
		"-ext-proc-listen", addr, "-admin", strings.TrimPrefix(p.admin, "http://"), "-config", cfg}, args...)...)
	cmd.Stdout, cmd.Stderr = p, p
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.cmd = cmd
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if log := p.logText(); strings.Contains(log, "DATA RACE") || strings.Contains(log, "panic:") {
			t.Errorf("the picker reported a race or a panic")
		}
		if t.Failed() {
			t.Logf("picker log:\n%s", p.logText())
		}
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p.client, p.health = extprocv3.NewExternalProcessorClient(conn), healthpb.NewHealthClient(conn)
	return p
}

func waitLog(t *testing.T, p *pickerProc, want string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !strings.Contains(p.logText(), want); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the picker never logged %q", want)
		}
	}
}

// pickUntil asks the picker for picks until cond holds of the endpoints offered (a 503
// while no endpoint is ready is waited through).
func pickUntil(t *testing.T, p *pickerProc, what string, cond func(dest []string) bool) {
	t.Helper()
	var last gatewayResult
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if last = gatewayCall(t, p); last.dest != nil && cond(last.dest) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last answer %+v", what, last)
		}
	}
}

type gatewayResult struct {
	dest      []string // the endpoints offered, the pick first; nil: an immediate answer
	immediate int      // the immediate answer's status
	status    int      // the picked endpoint's status; 0: the pick did not answer (body says why)
	body      string
}

// gatewayCall replays one chat completion as Envoy's ext_proc filter in
// FULL_DUPLEX_STREAMED mode sends it, forwards it to the pick over real HTTP and streams
// the answer back through the picker.
func gatewayCall(t *testing.T, p *pickerProc) gatewayResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := p.client.Process(ctx)
	if err != nil {
		return gatewayResult{immediate: -1, body: err.Error()}
	}
	body := []byte(`{"model":"` + p.model + `","messages":[{"role":"user","content":"hello"}],"max_tokens":5}`)
	hm := &corev3.HeaderMap{}
	for _, kv := range [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "gateway.example"}, {"content-type", "application/json"}} {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body[:20]}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body[20:], EndOfStream: true}}},
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			return gatewayResult{immediate: -1, body: err.Error()}
		}
	}
	resp, err := stream.Recv()
	if err != nil {
		return gatewayResult{immediate: -1, body: err.Error()}
	}
	if im := resp.GetImmediateResponse(); im != nil {
		return gatewayResult{immediate: int(im.GetStatus().GetCode()), body: string(im.GetBody())}
	}
	var out gatewayResult
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == picker.DestinationHeader {
			out.dest = strings.Split(string(h.GetHeader().GetRawValue()), ",")
		}
	}
	if out.dest == nil {
		t.Fatalf("the picker's answer to the headers has no %s: %v", picker.DestinationHeader, resp)
	}
	var sent []byte
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("the picker's answer to the body: %v", err)
		}
		sr := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		sent = append(sent, sr.GetBody()...)
		if sr == nil || sr.GetEndOfStream() {
			break
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+out.dest[0]+"/v1/chat/completions", bytes.NewReader(sent))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	hresp, err := http.DefaultClient.Do(req)
	if err != nil {
		// As Envoy meets a pick that stopped listening (a pod deleted and killed before
		// the picker saw the deletion): no answer from the pick. A caller that wants an
		// answer checks the status; one waiting for the picker to drop the pod goes on.
		out.status, out.body = 0, fmt.Sprintf("forwarding to the pick %s: %v", out.dest[0], err)
		return out
	}
	defer hresp.Body.Close()
	out.status = hresp.StatusCode
	served, _ := structpb.NewStruct(map[string]any{picker.ServedKey: out.dest[0]})
	rh := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(hresp.StatusCode))},
		{Key: "content-type", RawValue: []byte(hresp.Header.Get("Content-Type"))}}}
	step := func(m *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatalf("streaming the answer through the picker: %v", err)
		}
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("streaming the answer through the picker: %v", err)
		}
		return r
	}
	step(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: rh}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{picker.LBNamespace: served}}})
	answer, err := io.ReadAll(hresp.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	r := step(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: answer, EndOfStream: true}}})
	out.body = string(r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
	_ = stream.CloseSend()
	if out.status == http.StatusOK && !strings.Contains(out.body, `"choices"`) {
		t.Fatalf("the answer through the picker: %q", out.body)
	}
	return out
}

// TestKubernetesGatewayPickerMixesPlacedAndOwnPods: one InferencePool holds a pod Arbiter's
// control plane placed (a service on a GKE H100 spot node) and a pod the user deployed
// with the same label (on a Karpenter L4 spot node). The picker, given the pool and the
// control plane (-control), serves both, the placed pod once, as the control plane's
// replica at its placement price; it picks the user's cheaper L4 pod, and the placed one
// once the user's pod is deleted.
func TestKubernetesGatewayPickerMixesPlacedAndOwnPods(t *testing.T) {
	t.Parallel()
	k := startKube(t, "gwmix", "127.0.60.1/24")
	kubectl := func(args ...string) {
		t.Helper()
		if out, err := k.Kubectl(args...); err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	kubectl("apply", "-f", filepath.Join("testdata", "gateway-crds"))
	kubectl("wait", "--for=condition=Established", "--timeout=120s", "crd/inferencepools.inference.networking.k8s.io")
	kubectl("apply", "-f", filepath.Join("..", "deploy", "kubernetes", "gateway", "rbac.yaml"))
	k.AddNode(kubetest.GKENode("h100-spot", "us-central1", "us-central1-a", true, 1))
	k.AddNode(kubetest.KarpenterNode("l4-spot", "gpu", "us-east-1a", "spot", false))

	c := newCluster(t)
	useClusters(t, c, k)
	const name, model = "mix", "mix-model"
	c.up(name, kubeSpec(model, `replicas: 1`))
	var placed string // the control plane's replica ID
	c.waitFor("the placed replica ready", 90*time.Second, func() bool {
		for _, r := range c.status(name).Replicas {
			if r.State == "ready" {
				placed = r.ID
			}
		}
		return placed != ""
	})
	placedPod := k.Pods("arbiter", kubernetes.LabelReplica+"="+placed)
	if len(placedPod) != 1 || placedPod[0].Spec.NodeName != "h100-spot" {
		t.Fatalf("the placed replica's pod: %+v", placedPod)
	}
	placedAddr := placedPod[0].Status.PodIP + ":8000"

	dir := t.TempDir()
	write := func(file, y string) string {
		path := filepath.Join(dir, file)
		if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	kubectl("apply", "-f", write("pool.yaml", `apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: mix, namespace: arbiter}
spec:
  selector: {matchLabels: {arbiter.dev/service: mix}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: arbiter-picker, port: {number: 9002}}
`))
	kubectl("apply", "-f", write("own.yaml", `apiVersion: v1
kind: Pod
metadata: {name: own-l4, namespace: arbiter, labels: {arbiter.dev/service: mix}}
spec:
  nodeSelector: {kubernetes.io/hostname: l4-spot}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  containers:
    - name: vllm
      image: ghcr.io/arbiter-serve/replicasim:test
      command: [`+filepath.Join(binDir, "replicasim")+`, -listen, "$(POD_IP):8000", -model, `+model+`, -profile, h100-llama-3.1-8b, -log-level, warn]
      env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
      resources: {limits: {nvidia.com/gpu: 1}}
`))
	var own string
	c.waitFor("the user's pod running", 60*time.Second, func() bool {
		for _, p := range k.Pods("arbiter", "") {
			if p.Name == "own-l4" && p.Status.PodIP != "" {
				own = p.Status.PodIP + ":8000"
			}
		}
		return own != ""
	})

	p := startPicker(t, k.ServiceAccountKubeconfig("arbiter", "arbiter-picker"), "-pool-name", "mix", "-model", model,
		"-control", "http://"+c.api, "-token-file", control.TokenPath(c.home))
	pickUntil(t, p, "the user's L4 spot pod picked", func(dest []string) bool { return dest[0] == own })
	got := gatewayCall(t, p)
	if strings.Join(got.dest, ",") != own+","+placedAddr || got.status != http.StatusOK {
		t.Fatalf("offered %v (status %d %s), want the user's L4 pod %s, then the placed pod %s, once each", got.dest, got.status, got.body, own, placedAddr)
	}
	resp, err := http.Get(p.admin + "/replicas")
	if err != nil {
		t.Fatal(err)
	}
	var views []replicaView
	err = json.NewDecoder(resp.Body).Decode(&views)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, v := range views {
		ids = append(ids, v.ID)
	}
	slices.Sort(ids)
	want := []string{"arbiter/own-l4:8000", placed}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("the picker's replicas %v, want %v: the placed pod once, as the control plane's replica", ids, want)
	}

	kubectl("delete", "pod", "-n", "arbiter", "own-l4", "--wait=false")
	pickUntil(t, p, "the placed pod picked once the user's is gone", func(dest []string) bool { return strings.Join(dest, ",") == placedAddr })
}

package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runServe runs the CLI in-process with args, returning stdout, stderr and the error.
func runServe(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := root()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"--home", t.TempDir()}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// The forms SkyPilot's service files use for accelerator sets (testdata/skypilot, written
// for these tests): every file validates, warns where it must, and resolves to what runs.
func TestValidateSkyPilotAcceleratorForms(t *testing.T) {
	for _, tc := range []struct {
		file     string
		resolved []string // lines the resolved file holds
		warnings []string // lines of stderr, in order
	}{
		{file: "counts-mapping.yaml", resolved: []string{`accelerators: {'A100:4': null, 'A100:8': null, 'A100-80GB:2': null, 'A100-80GB:4': null, 'A100-80GB:8': null}`}},
		{file: "counts-block.yaml", resolved: []string{`accelerators: {'L4:1': null, 'L4:4': null}`}},
		{file: "counts-list.yaml", resolved: []string{`accelerators: ['A100:4', 'A100:8', 'H100:8']`}},
		{file: "unpriced-local.yaml", resolved: []string{`accelerators: {L4: 1, A100: 1}`},
			warnings: []string{`warning: testdata/skypilot/unpriced-local.yaml:5:24: resources.accelerators: "L40": no price catalog lists it (closest known: L4, L40S, A10), and none of this service's providers (local) offers a GPU no catalog lists`}},
		{file: "unpriced-kubernetes.yaml", resolved: []string{`accelerators: {L4: 1, L40: 1, A40: 1}`},
			warnings: []string{
				`warning: testdata/skypilot/unpriced-kubernetes.yaml:5:24: resources.accelerators: "L40": no price catalog lists it (closest known: L4, L40S, A10); kept, as kubernetes can run it without one, while a provider that places by price leaves it out`,
				`warning: testdata/skypilot/unpriced-kubernetes.yaml:5:31: resources.accelerators: "A40": no price catalog lists it`,
			}},
		{file: "unpriced-market.yaml", resolved: []string{`accelerators: {L4: 1, A100: 8}`},
			warnings: []string{
				`warning: testdata/skypilot/unpriced-market.yaml:4:24: resources.accelerators: "L40": no price catalog lists it (closest known: L4, L40S, A10), and none of this service's providers (sim) offers a GPU no catalog lists (kubernetes and runpod match names against their own nodes and GPU types); left out, the others remain`,
				`warning: testdata/skypilot/unpriced-market.yaml:4:31: resources.accelerators: "A40": no price catalog lists it`,
				`warning: testdata/skypilot/unpriced-market.yaml:4:46: resources.accelerators: "GB200": no price catalog lists it`,
			}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			out, errOut, err := runServe(t, "validate", "--env", "HF_TOKEN=x", filepath.Join("testdata/skypilot", tc.file))
			if err != nil {
				t.Fatalf("validate: %v\nstderr:\n%s", err, errOut)
			}
			for _, l := range tc.resolved {
				if !strings.Contains(out, l) {
					t.Errorf("resolved:\n%s\nwant a line %q", out, l)
				}
			}
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			if errOut == "" {
				lines = nil
			}
			if len(lines) != len(tc.warnings) {
				t.Fatalf("stderr:\n%s\nwant %d warnings", errOut, len(tc.warnings))
			}
			for i, w := range tc.warnings {
				if !strings.HasPrefix(lines[i], w) {
					t.Errorf("warning %d:\n%s\nwant it to start\n%s", i, lines[i], w)
				}
			}
		})
	}
}

func TestValidateRefusesASetWithNothingToRunOn(t *testing.T) {
	_, _, err := runServe(t, "validate", "testdata/skypilot/unpriced-only.yaml")
	var ce *cliError
	if !errors.As(err, &ce) || ce.code != exitUsage {
		t.Fatalf("err = %v, want a usage error", err)
	}
	for _, w := range []string{
		`testdata/skypilot/unpriced-only.yaml:4:21: resources.accelerators: "B100": no price catalog lists it`,
		`testdata/skypilot/unpriced-only.yaml:5:21: resources.accelerators: "GB200": no price catalog lists it`,
		"no other accelerator is left to run the service on",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error:\n%v\nwant %q", err, w)
		}
	}
}

// file_mounts, volumes, config and num_nodes in SkyPilot's forms (testdata/skypilot,
// written for these tests): what the providers can honour validates and resolves; what
// one cannot is refused at its place, naming the key and the provider.
func TestValidateSkyPilotMountForms(t *testing.T) {
	for _, tc := range []struct {
		file     string
		resolved []string
		warnings []string
	}{
		{file: "mounts-local.yaml", resolved: []string{"file_mounts:\n  /models: ~/checkpoints/sd-v1-5\n"},
			warnings: []string{"warning: testdata/skypilot/mounts-local.yaml:8:5: config.kubernetes.pod_config: has no effect: no provider in arbiter.providers (local) is one it is about"}},
		{file: "mounts-aws.yaml", resolved: []string{"/data: {source: 's3://vector-db-corpus/shards', mode: COPY}", "/weights: {source: 's3://sd-weights', mode: MOUNT_CACHED}"}},
		{file: "volumes-kubernetes.yaml", resolved: []string{"volumes:\n  /root/.cache/huggingface: hf-cache\n", "labels: {team: search}"}},
		{file: "num-nodes.yaml", resolved: []string{"num_nodes: 2\n"}},
		{file: "num-nodes-kubernetes.yaml", resolved: []string{"num_nodes: 2\n", "providers: [kubernetes]"}},
		{file: "num-nodes-aws.yaml", resolved: []string{"num_nodes: 2\n", "providers: [aws]"}},
		{file: "mounts-named.yaml", resolved: []string{"file_mounts:\n  /index: {source: 's3://doc-search-index', mode: MOUNT}\n"}},
		{file: "workdir-aws.yaml", resolved: []string{"workdir: testdata/skypilot/workdir-app\n", "/data: {source: 's3://vector-db-corpus/shards', mode: COPY}", "providers: [aws]"}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			out, errOut, err := runServe(t, "validate", filepath.Join("testdata/skypilot", tc.file))
			if err != nil {
				t.Fatalf("validate: %v\nstderr:\n%s", err, errOut)
			}
			for _, l := range tc.resolved {
				if !strings.Contains(out, l) {
					t.Errorf("resolved:\n%s\nwant %q", out, l)
				}
			}
			if got := strings.TrimSpace(errOut); len(tc.warnings) == 0 && got != "" || len(tc.warnings) > 0 && !strings.HasPrefix(got, tc.warnings[0]) {
				t.Errorf("stderr:\n%s\nwant %q", errOut, tc.warnings)
			}
		})
	}
	// An env given at launch fills the bucket in before the source is classified; the
	// placeholder the file holds is a local folder, which the block form refuses.
	if out, errOut, err := runServe(t, "validate", "--env", "ADAPTER_BUCKET=s3://support-adapters/v3", "testdata/skypilot/mounts-env.yaml"); err != nil ||
		!strings.Contains(out, "/adapters: {source: 's3://support-adapters/v3', mode: MOUNT}") {
		t.Errorf("mounts-env.yaml with --env: %v\n%s\n%s", err, out, errOut)
	}
	if _, _, err := runServe(t, "validate", "testdata/skypilot/mounts-env.yaml"); err == nil ||
		!strings.Contains(err.Error(), "mounts-env.yaml:12:13: file_mounts./adapters: a local source in the block form") {
		t.Errorf("mounts-env.yaml without --env: %v", err)
	}
	// A replica over several machines where each replica is one machine is refused.
	if _, _, err := runServe(t, "validate", "testdata/skypilot/num-nodes-runpod.yaml"); err == nil ||
		!strings.Contains(err.Error(), "num-nodes-runpod.yaml:3:12: num_nodes: 2: the runpod provider launches a replica on one machine; run multi-node replicas on the local, kubernetes or aws provider") {
		t.Errorf("num_nodes on runpod: %v", err)
	}
	// A workdir is read where serve runs: one that is not a folder here is refused at its place.
	moved := filepath.Join(t.TempDir(), "workdir-aws.yaml")
	b, err := os.ReadFile("testdata/skypilot/workdir-aws.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(moved, []byte(strings.Replace(string(b), "workdir-app", "workdir-gone", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runServe(t, "validate", moved); err == nil || !strings.Contains(err.Error(), "workdir-aws.yaml:4:10: workdir: ") || !strings.Contains(err.Error(), "workdir-gone does not exist here") {
		t.Errorf("a missing workdir: %v", err)
	}
	_, _, err = runServe(t, "validate", "testdata/skypilot/refused-mounts.yaml")
	for _, w := range []string{
		"refused-mounts.yaml:5:3: file_mounts./data: the kubernetes",
		"refused-mounts.yaml:8:5: config.kubernetes.provision_timeout: Arbiter replaces a replica not ready in time",
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error:\n%v\nwant %q", err, w)
		}
	}
}

// The placement preview quotes only the clouds a provider launches on: the embedded
// catalogs' cheapest H100 is a Vast marketplace offer ($1.80/h on 2026-08-01), which no
// replica can be bought at (issue 48).
func TestValidatePreviewQuotesLaunchableClouds(t *testing.T) {
	f := filepath.Join(t.TempDir(), "h100.yaml")
	if err := os.WriteFile(f, []byte("resources:\n  accelerators: H100:1\nservice:\n  readiness_probe: /health\nrun: vllm serve meta-llama/Llama-3.1-8B-Instruct\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runServe(t, "validate", f)
	if err != nil {
		t.Fatalf("validate: %v\nstderr:\n%s", err, errOut)
	}
	if !strings.Contains(out, "# cheapest catalog offers of the clouds Arbiter launches on, aws, gcp, azure") {
		t.Fatalf("output:\n%s\nwant the preview's offers", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(strings.TrimPrefix(l, "#")); len(f) > 2 && (f[1] == "vast" || f[1] == "lambda") {
			t.Errorf("the preview quotes a marketplace: %s", l)
		}
	}
}

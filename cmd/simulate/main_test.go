package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/arbiter-serve/arbiter/sim"
)

func TestPrintsOneRowPerSystem(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"-spec", "../../bench/sim/h100-gcp.yaml", "-requests", "azure-conversation", "-hours", "0.5", "-calibrate=false"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "| azure-conversation | skypilot-preemption-aws-04-22-2023-v100_1 | ") {
			rows++
			cells := strings.Split(line, "|")
			if len(cells) != 22 {
				t.Fatalf("%d cells in %q", len(cells), line)
			}
			if peak, err := strconv.Atoi(strings.TrimSpace(cells[18])); err != nil || (strings.Contains(cells[5], "arbiter") && peak > 16) {
				t.Errorf("peak replicas %q (max_replicas 16) in %q", cells[18], line)
			}
		}
	}
	if rows != 3 {
		t.Fatalf("%d rows, want ondemand, skyserve and arbiter:\n%s", rows, out.String())
	}
}

func TestBadArgumentsAreErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-spec", "../../bench/sim/h100-gcp.yaml", "-requests", "nope", "-calibrate=false"},
		{"-spec", "../../bench/sim/h100-gcp.yaml", "-systems", "nope", "-hours", "0.1", "-calibrate=false"},
		{"-spec", "missing.yaml"},
		{"-spec", "../../bench/sim/h100-gcp.yaml", "-start", "yesterday"},
		{"-spec", "../../bench/sim/h100-gcp.yaml", "-capacity", "lots", "-calibrate=false"},
		{"-spec", "../../bench/sim/h100-gcp.yaml", "-days", "0", "-calibrate=false"},
		{"-spec", "../../bench/sim/h100-gcp.yaml", "-requests", "file:/nonexistent.csv", "-calibrate=false"},
	} {
		if err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// A user's own trace replays from a file, day after day, under both readings of capacity;
// the summary gives each cell over its days, and the zones' mapping is printed.
func TestOwnTraceOverDaysAndReadings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mine.csv")
	var b strings.Builder
	b.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	for i := range 600 { // one request every 6 s for an hour
		fmt.Fprintf(&b, "2024-05-10 00:%02d:%02d.0000000,%d,%d\n", i/10, (i%10)*6, 500+i%7*100, 100+i%5*20)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := run([]string{"-spec", "../../bench/sim/h100-gcp.yaml", "-requests", "file:" + path, "-hours", "0.5", "-days", "2",
		"-capacity", "availability,count", "-calibrate=false", "-iso-slo=false"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	text := out.String()
	days := map[string]int{}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "| file:"+path+" | ") {
			cells := strings.Split(line, "|")
			if len(cells) == 22 {
				days[strings.TrimSpace(cells[3])+" "+strings.TrimSpace(cells[4])]++
			}
		}
	}
	for _, k := range []string{"availability 0", "availability 1", "count 0", "count 1"} {
		if days[k] != 3 {
			t.Errorf("%s: %d rows, want one per system:\n%s", k, days[k], text)
		}
	}
	if !strings.Contains(text, "| Arbiter $/day (mean) |") || strings.Count(text, "| file:"+path+" | skypilot-preemption-aws-04-22-2023-v100_1 | ") != 12+2 {
		t.Errorf("no summary row per reading:\n%s", text)
	}
	if !strings.Contains(text, "us-east-1c → us-") || strings.Contains(text, "anywhere") {
		t.Errorf("the AWS US trace's zones are not mapped onto US zones:\n%s", text)
	}
}

// Without the equal-SLO search, a day where SkyServe's attainment differs from Arbiter's has
// no equal-SLO ratio, and the summary says so instead of showing the ratio as set.
func TestNoEqualSLORatioWithoutTheSearch(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"-spec", "../../bench/sim/h100-gcp.yaml", "-requests", "azure-conversation", "-hours", "2", "-days", "2",
		"-calibrate=false", "-iso-slo=false", "-systems", "arbiter,skyserve"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "day(s) (-iso-slo=false)") {
		t.Fatalf("no day without the search reported:\n%s", out.String())
	}
}

// SkyServe's attainment moves in steps with its replica count, so the equal-SLO figure is
// the two settings either side of Arbiter's attainment, interpolated; with no setting below
// it (the cheapest searched still serves better), that setting's cost stands and the
// summary says so.
func TestEqualSLOCostInterpolatesBetweenSettings(t *testing.T) {
	res := func(met int, dollars float64) *sim.Result {
		return &sim.Result{Requests: 1000, SLOMet: met, Dollars: dollars}
	}
	// 96 % at $600 and 98 % at $700: Arbiter's 97 % costs $650.
	if got, exact := equalSLOCost(0.97, res(980, 700), res(960, 600)); !exact || math.Abs(got-650) > 1e-9 {
		t.Fatalf("between 96 %% ($600) and 98 %% ($700), 97 %% costs $%.2f (exact %v); want $650", got, exact)
	}
	if got, exact := equalSLOCost(0.97, res(990, 800), nil); exact || got != 800 {
		t.Fatalf("with nothing below: $%.2f (exact %v); want the setting's own $800, not exact", got, exact)
	}
	if got, exact := equalSLOCost(0.97, res(968, 640), res(950, 500)); exact || got != 640 {
		t.Fatalf("a setting just short of the goal (within the tolerance): $%.2f (exact %v); want its own $640", got, exact)
	}

	cheapestSetting := &row{label: "skyserve, target_qps ×8", sys: sim.SkyServe, res: res(990, 80)}
	if cheapestSetting.settle(0.96, 0.005) {
		t.Fatal("a search with no setting below Arbiter's attainment reported an interpolation")
	}
	above := &dayRun{rows: []row{{label: "arbiter", sys: sim.Arbiter, res: res(960, 100)}, {label: "skyserve", sys: sim.SkyServe, res: res(995, 90)}},
		iso: map[sim.System]*row{sim.SkyServe: cheapestSetting}}
	if dollars, flagged, ok := above.atEqualSLO(sim.SkyServe); !ok || !flagged || dollars != 80 {
		t.Fatalf("cheapest setting still 3 points above: $%.2f, flagged %v, ok %v; want $80, flagged", dollars, flagged, ok)
	}
	var out bytes.Buffer
	printSummaries(&out, []summary{{requests: "r", spot: "s", runs: []dayRun{*above}}})
	if !strings.Contains(out.String(), "above Arbiter's attainment even at its cheapest setting on 1 day(s)") {
		t.Fatalf("the summary does not say the equal-SLO figure is not equal:\n%s", out.String())
	}
}

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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

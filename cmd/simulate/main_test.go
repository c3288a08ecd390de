package main

import (
	"bytes"
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
			if len(cells) != 18 {
				t.Fatalf("%d cells in %q", len(cells), line)
			}
			if peak, err := strconv.Atoi(strings.TrimSpace(cells[14])); err != nil || (strings.Contains(cells[3], "arbiter") && peak > 16) {
				t.Errorf("peak replicas %q (max_replicas 16) in %q", cells[14], line)
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
	} {
		if err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

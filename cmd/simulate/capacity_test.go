package main

import (
	"bytes"
	"encoding/csv"
	"math"
	"strconv"
	"strings"
	"testing"
)

// simulate capacity prints one CSV row per GPU and shape; a faster card sustains more, a
// longer request less, and $/M tokens is the hour's price over the tokens served in it, the
// price of a named offer of a cloud Arbiter launches on (issue 48: the H100 was priced at a
// marketplace's $1.80/h no provider can buy).
func TestCapacityCSV(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"capacity", "-model", "meta-llama/Llama-3.1-8B-Instruct", "-gpus", "L4,H100", "-lengths", "512:128,2048:256",
		"-tpot-ms", "100", "-ttft-ms", "2000", "-requests", "200"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&out).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(recs[0], ","); got != "gpu,input_len,output_len,max_req_per_s,usd_per_hour,offer,usd_per_m_tokens" {
		t.Fatalf("header %q", got)
	}
	if len(recs) != 5 {
		t.Fatalf("%d rows, want 4:\n%q", len(recs)-1, recs)
	}
	rate := map[string]float64{}
	for _, r := range recs[1:] {
		in, _ := strconv.Atoi(r[1])
		o, _ := strconv.Atoi(r[2])
		rps, err1 := strconv.ParseFloat(r[3], 64)
		usdH, err2 := strconv.ParseFloat(r[4], 64)
		perM, err3 := strconv.ParseFloat(r[6], 64)
		if err1 != nil || err2 != nil || err3 != nil || rps <= 0 || usdH <= 0 {
			t.Fatalf("row %q", r)
		}
		if cloud, _, _ := strings.Cut(r[5], " "); cloud != "aws" && cloud != "gcp" && cloud != "azure" || strings.Count(r[5], " ") != 2 {
			t.Errorf("row %q: offer %q; want cloud, instance type and region of aws, gcp or azure", r, r[5])
		}
		if want := usdH / (rps * 3600 * float64(in+o)) * 1e6; math.Abs(perM-want)/want > 0.01 {
			t.Errorf("row %q: $/M tokens %g, want %g", r, perM, want)
		}
		rate[r[0]+" "+r[1]] = rps
	}
	if rate["H100 512"] <= 2*rate["L4 512"] || rate["L4 2048"] >= rate["L4 512"] || rate["H100 2048"] >= rate["H100 512"] {
		t.Errorf("rates %v: want the H100 well above the L4 and longer requests below shorter ones", rate)
	}
}

func TestCapacityBadArguments(t *testing.T) {
	base := []string{"capacity", "-model", "llama-3.1-8b", "-gpus", "L4", "-lengths", "512:128", "-tpot-ms", "100"}
	for _, tc := range [][]string{
		{"-model", "gpt-5"},
		{"-gpus", "MI300"},
		{"-lengths", "512"},
		{"-lengths", "512:1"},
		{"-tpot-ms", "0"},
		{"-ttft-ms", "-1"},
		{"-burst", "0"},
		{"-burst", "1000"},
		{"-gpus", "T4", "-model", "llama-3.1-70b"},
		{"-providers", "runpod"},
	} {
		args := append(append([]string{}, base...), tc...)
		if err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", tc)
		}
	}
}

// gpumix prints arbiter-mix's row for the day and, learning, each offered GPU type's
// headroom at the day's end.
func TestGPUMixPrintsTheRowAndTheLearnedHeadroom(t *testing.T) {
	if testing.Short() {
		t.Skip("a simulated half hour of a mixed fleet")
	}
	var out bytes.Buffer
	err := run([]string{"gpumix", "-spec", "../../bench/sim/gpumix.yaml", "-hours", "0.5", "-utilization", "0.35", "-requests", "azure-conversation", "-systems", "arbiter-mix"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "| azure-conversation | 0 | arbiter-mix | ") {
		t.Errorf("no arbiter-mix row:\n%s", s)
	}
	want := "<!-- azure-conversation day 0: arbiter-mix's headroom per GPU type at the day's end, learned from 0.35: A100-80GB "
	if !strings.Contains(s, want) || !strings.Contains(s, ", L40S ") {
		t.Errorf("no headroom per type (%q):\n%s", want, s)
	}
}

package main

import (
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/pricing"
)

const capacityUsage = `usage: simulate capacity -model MODEL -gpus GPU[,GPU…] -lengths IN:OUT[,IN:OUT…] -tpot-ms T [-ttft-ms T] [-burst N]

Prints CSV: for each GPU and request shape, the highest Poisson request rate one replica
sustains with its queue steady and the p90 time per output token (and time to first token)
within the targets, its on-demand $/hour (the cheapest on-demand offer with as many GPUs as
the profile uses, from the catalogs of the clouds -providers names: those Arbiter launches
on), the offer (cloud, instance type, region), and $ per million tokens (prompt plus output)
at that rate. A rate of 0 means even one request alone misses a target; its $/M tokens is
then "inf". With -burst N
the requests arrive N at a time, within one second, as real traces bunch them: a GPU whose
prefill of one prompt is slower than the TPOT target loses more of its rate to bursts.`

// capacity is the "simulate capacity" subcommand.
func capacity(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("simulate capacity", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), capacityUsage); fs.PrintDefaults() }
	model := fs.String("model", "", "model: a short name ("+strings.Join(engine.ModelNames(), ", ")+"; with -fp8, its FP8 checkpoint: weights and KV cache at one byte) or its Hugging Face id")
	gpuList := fs.String("gpus", "L4,A10G,A100-80GB,H100", "GPUs, comma-separated, as the catalogs name them")
	lengths := fs.String("lengths", "", "request shapes IN:OUT (prompt and output tokens), comma-separated")
	tpotMs := fs.Float64("tpot-ms", 0, "p90 time-per-output-token target (ms), required")
	ttftMs := fs.Float64("ttft-ms", 0, "p90 time-to-first-token target (ms); 0: none")
	requests := fs.Int("requests", 400, "requests per trial rate, at least a minute of arrivals and at most 20,000 (the first 10 % are warm-up and not scored)")
	seed := fs.Uint64("seed", 1, "random seed of the Poisson arrivals")
	burst := fs.Int("burst", 1, "requests arriving together, within one second (1: one by one)")
	start := fs.String("start", "2026-08-01", "date whose catalog prices are used (UTC)")
	provs := fs.String("providers", strings.Join(pricing.Launchable, ","), "clouds whose catalog prices count, comma-separated: those Arbiter launches on (aws through its EC2 provider; aws, gcp and azure through Kubernetes clusters there); lambda and vast are catalogs of marketplaces no provider launches on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("capacity: unexpected argument %q", fs.Arg(0))
	}
	m, err := engine.LookupModel(*model)
	if err != nil {
		return fmt.Errorf("-model: %w", err)
	}
	if *tpotMs <= 0 || *ttftMs < 0 || math.IsNaN(*tpotMs+*ttftMs) {
		return fmt.Errorf("-tpot-ms %g, -ttft-ms %g: want a TPOT target > 0 and a TTFT target ≥ 0", *tpotMs, *ttftMs)
	}
	if *requests < 20 {
		return fmt.Errorf("-requests %d: want 20 or more", *requests)
	}
	if *burst < 1 || *burst > *requests/2 {
		return fmt.Errorf("-burst %d: want 1 to half of -requests (%d)", *burst, *requests/2)
	}
	shapes, err := parseLengths(*lengths)
	if err != nil {
		return err
	}
	at, err := time.Parse(time.DateOnly, *start)
	if err != nil {
		return fmt.Errorf("-start: %w", err)
	}
	cat, err := pricing.Embedded()
	if err != nil {
		return err
	}
	cat, err = cat.Only(strings.Split(*provs, ",")...)
	if err != nil {
		return fmt.Errorf("-providers: %w", err)
	}
	offers := cat.Offers(at)
	if len(offers) == 0 {
		return fmt.Errorf("-providers %q: no catalog offer of those at %s", *provs, *start)
	}
	w := csv.NewWriter(out)
	if err := w.Write([]string{"gpu", "input_len", "output_len", "max_req_per_s", "usd_per_hour", "offer", "usd_per_m_tokens"}); err != nil {
		return err
	}
	for _, name := range strings.Split(*gpuList, ",") {
		g, err := engine.LookupGPU(name)
		if err != nil {
			return fmt.Errorf("-gpus: %w", err)
		}
		prof, err := engine.LoadProfile(g.Name + "-" + m.Name)
		if err != nil {
			return err
		}
		tp := max(1, prof.TensorParallel)
		offer, ok := pricing.CheapestOnDemand(offers, g.Catalog, tp)
		if !ok {
			return fmt.Errorf("-gpus %s: the catalogs of %s price no on-demand instance with %d × %s at %s", name, *provs, tp, g.Name, *start)
		}
		price, named := offer.PricePerHour, fmt.Sprintf("%s %s %s", offer.Provider, offer.InstanceType, offer.Region)
		for _, sh := range shapes {
			rate, err := engine.MaxRateInBursts(*prof, sh[0], sh[1], *tpotMs, *ttftMs, *requests, *burst, *seed)
			if err != nil {
				return fmt.Errorf("%s, %d:%d: %w", g.Name, sh[0], sh[1], err)
			}
			perM := "inf"
			if rate > 0 {
				perM = strconv.FormatFloat(price/(rate*3600*float64(sh[0]+sh[1]))*1e6, 'g', 6, 64)
			}
			if err := w.Write([]string{strings.TrimSpace(name), strconv.Itoa(sh[0]), strconv.Itoa(sh[1]),
				strconv.FormatFloat(rate, 'f', 3, 64), strconv.FormatFloat(price, 'f', 4, 64), named, perM}); err != nil {
				return err
			}
		}
	}
	w.Flush()
	return w.Error()
}

func parseLengths(s string) ([][2]int, error) {
	if s == "" {
		return nil, errors.New("-lengths: required, e.g. 512:128,2048:256")
	}
	var out [][2]int
	for _, part := range strings.Split(s, ",") {
		in, o, ok := strings.Cut(strings.TrimSpace(part), ":")
		a, err1 := strconv.Atoi(in)
		b, err2 := strconv.Atoi(o)
		if !ok || err1 != nil || err2 != nil || a < 1 || b < 2 {
			return nil, fmt.Errorf("-lengths: %q: want IN:OUT with IN ≥ 1 prompt tokens and OUT ≥ 2 output tokens (a TPOT needs two)", part)
		}
		out = append(out, [2]int{a, b})
	}
	return out, nil
}

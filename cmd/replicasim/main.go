// Command replicasim is a vLLM-compatible replica without a GPU, for tests, benchmarks and
// the local provider's default service.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/internal/httplog"
	"github.com/arbiter-serve/arbiter/internal/text/tokens"
	"github.com/arbiter-serve/arbiter/replicasim"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "replicasim:", err)
		os.Exit(2)
	}
}

func run() error {
	var (
		listen      = flag.String("listen", envOr("REPLICASIM_LISTEN", "127.0.0.1:8000"), "address to serve on (the PORT env var, if set, overrides the port)")
		model       = flag.String("model", "meta-llama/Llama-3.1-8B-Instruct", "served model name")
		profile     = flag.String("profile", "h100-llama-3.1-8b", fmt.Sprintf("GPU profile: measured %v, any GPU[xN]-MODEL pair generated from data sheets (GPUs %v, models %v, each also as MODEL-fp8, its FP8 checkpoint; e.g. l4-llama-3.1-8b, l40s-llama-3.1-8b-fp8), or a .json file", engine.ProfileNames(), engine.GPUNames(), engine.ModelNames()))
		gpu         = flag.String("gpu", "", "the replica's GPU as the price catalogs name it (L4, A100-80GB, H100; a local or sim replica gets its own in $ARBITER_ACCELERATOR): the profile is the one generated for it and -model, in place of -profile")
		details     = flag.Bool("enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens, as vLLM's --enable-prompt-tokens-details does")
		store       = flag.Bool("enable-responses-store", false, "keep Responses API answers for previous_response_id and GET /v1/responses/{id}, as vLLM does with VLLM_ENABLE_RESPONSES_API_STORE=1 (also honoured)")
		task        = flag.String("task", replicasim.TaskGenerate, fmt.Sprintf("what the model serves, as vLLM's --task: %v (embed, classify and score are pooling models: rerank, score, pooling, classify; transcription a Whisper model)", replicasim.TaskNames))
		echo        = flag.Bool("echo", false, "answer at once with no model delay (proxy benchmarks)")
		echoEvery   = flag.Duration("echo-token-interval", 0, "pace echo-mode stream tokens")
		tokenizer   = flag.String("tokenizer", "", "prompt token counter: bpe or approx (default bpe; approx in echo mode)")
		listenDelay = flag.Duration("listen-delay", 0, "refuse connections for this long after start (a loading vLLM)")
		readyDelay  = flag.Duration("ready-delay", 0, "answer /health with 503 for this long after listening")
		coldStart   = flag.String("cold-start", "", "model a vLLM replica's start-up: vllm (the port bound at once, nothing answered until the weights are read, the engine started and CUDA graphs captured), or empty for none")
		loadRate    = flag.Float64("load-gib-s", replicasim.DefaultLoadGiBPerSecond, "with -cold-start vllm: the bandwidth the profile's weights are read at, GiB/s (0.51: a local disk, as vLLM logged it)")
		engineStart = flag.Duration("engine-start", replicasim.DefaultEngineStart, "with -cold-start vllm: the start-up but weights and graphs (imports, API server, torch.compile from cache, KV-cache profiling)")
		graphs      = flag.Duration("cuda-graph-capture", replicasim.DefaultGraphCapture, "with -cold-start vllm: CUDA-graph capture")
		eager       = flag.Bool("enforce-eager", false, "with -cold-start vllm: skip CUDA-graph capture, as vLLM's --enforce-eager does")
		faultKind   = flag.String("fault", "", "inject a fault: reset, status, hang, die_mid_stream, crash, garbage, slow")
		faultCount  = flag.Int("fault-count", 0, "apply the fault to the next N requests (0: all)")
		faultAfter  = flag.Int("fault-after-tokens", 0, "tokens before a mid-stream fault strikes")
		faultStatus = flag.Int("fault-status", 503, "status for the status fault")
		slowdown    = flag.Float64("fault-slowdown", 4, "step-time multiplier for the slow fault")
		logLevel    = flag.String("log-level", "info", "debug, info, warn or error")
		schedPolicy = flag.String("scheduling-policy", "fcfs", "the engine's queue, as vLLM's --scheduling-policy: fcfs, or priority (by each request's priority field, lower first, then arrival)")
		enableLoRA  = flag.Bool("enable-lora", false, "serve LoRA adapters on the model, as vLLM's --enable-lora (the run-time load and unload endpoints with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, as in vLLM)")
		maxLoRAs    = flag.Int("max-loras", 1, "with -enable-lora: the most distinct adapters in one batch (GPU slots), as vLLM's --max-loras")
		maxLoRARank = flag.Int("max-lora-rank", 16, "with -enable-lora: the largest adapter rank, as vLLM's --max-lora-rank")
		maxCPULoRAs = flag.Int("max-cpu-loras", 0, "with -enable-lora: adapters kept in CPU memory (default -max-loras), as vLLM's --max-cpu-loras")
		loraModules loraFlag
	)
	flag.Var(&loraModules, "lora-modules", "with -enable-lora: adapters loaded at start, as vLLM's --lora-modules: name=path or JSON {\"name\",\"path\",\"base_model_name\"}; several after one flag, as vLLM takes them, or the flag repeated")
	var stopAfter int
	flag.IntVar(&stopAfter, "stop-after", 64, "output tokens before the simulated model stops when a request sets no max_tokens")
	flag.IntVar(&stopAfter, "default-max-tokens", 64, "the old name of -stop-after")
	args := os.Args[1:]
	var ignored []string
	asVLLM := filepath.Base(os.Args[0]) == "vllm" || (len(args) > 0 && args[0] == "serve")
	if asVLLM {
		var err error
		if args, ignored, err = vllmServeArgs(args, os.Getenv("ARBITER_ACCELERATOR")); err != nil {
			return err
		}
	}
	if err := flag.CommandLine.Parse(replicasim.ExpandNargs(args, "lora-modules")); err != nil {
		return err
	}
	log, err := httplog.NewLogger(*logLevel)
	if err != nil {
		return err
	}
	if asVLLM {
		log.Warn("replicasim stands in for vllm (none on this machine's PATH): the replica is simulated", "model", *model)
	}
	if len(ignored) > 0 {
		log.Warn("replicasim simulating `vllm serve`: these flags change nothing in a simulator and are ignored", "flags", strings.Join(ignored, " "), "as", strings.Join(args, " "))
	}

	addr := *listen
	if port := os.Getenv("PORT"); port != "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("-listen %q: %w", addr, err)
		}
		addr = net.JoinHostPort(host, port)
	}
	if *schedPolicy != "fcfs" && *schedPolicy != "priority" {
		return fmt.Errorf("-scheduling-policy %q: want fcfs or priority", *schedPolicy)
	}
	cfg := replicasim.Config{PriorityScheduling: *schedPolicy == "priority", Model: *model, Echo: *echo, EchoTokenInterval: *echoEvery, StopAfter: stopAfter, Logger: log, PromptTokensDetails: *details, StoreResponses: *store, Task: *task}
	if *enableLoRA {
		cfg.LoRA = &replicasim.LoRAConfig{MaxLoRAs: *maxLoRAs, MaxLoRARank: *maxLoRARank, MaxCPULoRAs: *maxCPULoRAs, Modules: loraModules,
			RuntimeUpdates: replicasim.RuntimeLoRAUpdates(os.Getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING")), LoadGiBPerSecond: *loadRate}
	} else if len(loraModules) > 0 {
		return errors.New("-lora-modules needs -enable-lora, as in vLLM")
	}
	if *gpu != "" {
		name, err := engine.ProfileOn(*gpu, *model)
		if err != nil {
			return fmt.Errorf("-gpu %s: %w", *gpu, err)
		}
		*profile = name
	}
	if !*echo {
		p, err := engine.LoadProfile(*profile)
		if err != nil {
			return err
		}
		cfg.Profile = p
	}
	if *tokenizer != "" {
		c, err := tokens.New(*tokenizer)
		if err != nil {
			return err
		}
		cfg.Tokenizer = c
	}
	srv, err := replicasim.New(cfg)
	if err != nil {
		return err
	}
	if *faultKind != "" {
		f := replicasim.Fault{Kind: *faultKind, Count: *faultCount, AfterTokens: *faultAfter, Status: *faultStatus, Slowdown: *slowdown}
		if err := srv.SetFault(f); err != nil {
			return err
		}
	}

	var cold *replicasim.ColdStart
	switch *coldStart {
	case "":
	case "vllm":
		cs := replicasim.ColdStart{LoadGiBPerSecond: *loadRate, EngineStart: *engineStart, GraphCapture: *graphs}
		if cfg.Profile != nil {
			cs.WeightGiB = cfg.Profile.WeightGiB
		}
		if *eager {
			cs.GraphCapture = 0
		}
		if err := cs.Validate(); err != nil {
			return err
		}
		cold = &cs
	default:
		return fmt.Errorf("-cold-start %q: want vllm, or empty for none", *coldStart)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *listenDelay > 0 {
		log.Info("loading (connections refused)", "for", *listenDelay)
		select {
		case <-time.After(*listenDelay):
		case <-ctx.Done():
			return nil
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if cold != nil {
		// The port is bound and nothing is answered until the engine is up, as with vLLM.
		log.Info("cold start: port bound, loading", "addr", ln.Addr().String(), "weights_gib", cold.WeightGiB, "total", cold.Total())
		for _, ph := range cold.Phases() {
			select {
			case <-time.After(ph.Took):
				log.Info(ph.Log)
			case <-ctx.Done():
				_ = ln.Close()
				return nil
			}
		}
	}
	srv.SetReadyAt(time.Now().Add(*readyDelay))
	log.Info("serving", "addr", ln.Addr().String(), "model", *model, "echo", *echo, "profile", *profile)
	go srv.Run(ctx)
	if err := srv.Serve(ctx, ln); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// loraFlag collects --lora-modules entries.
type loraFlag []replicasim.LoRAModule

func (f *loraFlag) String() string { return fmt.Sprint(len(*f), " modules") }

func (f *loraFlag) Set(v string) error {
	m, err := replicasim.ParseLoRAModule(v)
	if err != nil {
		return err
	}
	*f = append(*f, m)
	return nil
}

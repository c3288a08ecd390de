// Package providers reads the daemon's providers file (--providers, default
// $ARBITER_HOME/providers.yaml): the Kubernetes clusters, the AWS account and the RunPod
// account a control plane launches replicas in, beside the built-in local and sim providers.
package providers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"gopkg.in/yaml.v3"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/aws"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes"
	"github.com/arbiter-serve/arbiter/replicas/runpod"
)

// File is the providers file.
type File struct {
	Kubernetes []kubernetes.Cluster `yaml:"kubernetes"`
	// AWS is the account EC2 replicas run in (provider aws); nil: none.
	AWS *aws.Account `yaml:"aws"`
	// RunPod is the account RunPod pods run in (provider runpod); nil: none.
	RunPod *runpod.Account `yaml:"runpod"`
}

// Load reads a providers file strictly: an unknown key is an error, not ignored.
func Load(path string) (File, error) {
	var f File
	b, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return f, fmt.Errorf("%s: %w", path, err)
	}
	if err := kubernetes.CheckClusters(path, f.Kubernetes); err != nil {
		return f, err
	}
	if f.AWS != nil {
		if err := f.AWS.Check(); err != nil {
			return f, fmt.Errorf("%s: aws: %w", path, err)
		}
	}
	if f.RunPod != nil {
		if err := f.RunPod.Check(); err != nil {
			return f, fmt.Errorf("%s: runpod: %w", path, err)
		}
	}
	return f, nil
}

// FromFile builds the providers a providers file configures, for owner. A missing file
// configures none when optional (the default path); a cluster or region that cannot be
// reached is not an error here (each call that needs it reports it, and placement skips
// it), but a file that does not load is.
func FromFile(ctx context.Context, path string, optional bool, owner string, log *slog.Logger) ([]replicas.Provider, error) {
	f, err := Load(path)
	if optional && errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("providers file: %w", err)
	}
	out, err := kubernetes.Providers(ctx, path, f.Kubernetes, owner, log)
	if err != nil {
		return nil, err
	}
	if f.AWS != nil {
		p, err := aws.New(ctx, aws.Config{Account: *f.AWS, Owner: owner, Log: log})
		if err != nil {
			return nil, fmt.Errorf("providers file %s: %w", path, err)
		}
		log.Info("aws account configured", "provider", p.Name(), "regions", p.Regions())
		out = append(out, p)
	}
	if f.RunPod != nil {
		p, err := runpod.New(ctx, runpod.Config{Account: *f.RunPod, Owner: owner, Log: log})
		if err != nil {
			return nil, fmt.Errorf("providers file %s: %w", path, err)
		}
		log.Info("runpod account configured", "provider", p.Name())
		out = append(out, p)
	}
	return out, nil
}

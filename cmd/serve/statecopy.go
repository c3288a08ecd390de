package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/state"
)

// stateCmd is `serve state`: the state store itself.
func stateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "state", Short: "The control plane's state store (SQLite file or PostgreSQL)"}
	var to, toFile, from string
	cp := &cobra.Command{
		Use:   "copy --to postgres://…",
		Short: "Copy a home's SQLite state into an empty PostgreSQL database, once",
		Long: `Copies every service, version, replica (with its provider handle) and event of a SQLite
state file into a PostgreSQL database that holds none yet, in one transaction. Stop the
control plane that owns the file first; then start it (or several) with --state set to
the same URL, and it adopts the replicas the file listed.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			url, err := copyTarget(to, toFile)
			if err != nil {
				return err
			}
			if from == "" {
				from = control.StatePath(g.home)
			}
			if _, err := os.Stat(from); err != nil {
				return fmt.Errorf("--from: %w", err)
			}
			ctx := c.Context()
			src, err := state.Open(from)
			if err != nil {
				return err
			}
			defer src.Close()
			dst, err := state.OpenPostgres(ctx, url, state.Options{})
			if err != nil {
				return err
			}
			defer dst.Close()
			n, err := state.Copy(ctx, dst, src)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "copied %s into %s: %d services, %d versions, %d replicas, %d events, %d adapters' use, %d tenant-days of spend\n",
				from, state.Describe(url), n.Services, n.Versions, n.Replicas, n.Events, n.AdapterUses, n.TenantSpends)
			return nil
		},
	}
	f := cp.Flags()
	f.StringVar(&to, "to", "", "the PostgreSQL database: a postgres:// URL")
	f.StringVar(&toFile, "to-file", "", "file holding the --to URL (a mounted Kubernetes Secret)")
	f.StringVar(&from, "from", "", "the SQLite state file (default: <home>/state.db)")
	cmd.AddCommand(cp)
	return cmd
}

func copyTarget(to, file string) (string, error) {
	if file != "" {
		if to != "" {
			return "", errors.New("--to and --to-file: give one")
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--to-file: %w", err)
		}
		to = strings.TrimSpace(string(b))
	}
	if !state.IsPostgres(to) {
		return "", errors.New("--to: want a postgres:// or postgresql:// URL")
	}
	return to, nil
}

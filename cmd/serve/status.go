package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/fleet"
)

func statusCmd(g *globals) *cobra.Command {
	var asJSON, verbose, endpoint, all bool
	cmd := &cobra.Command{
		Use:   "status [NAME...] [-v] [-a] | --endpoint NAME",
		Short: "Show services and their replicas",
		RunE: func(cmd *cobra.Command, args []string) error {
			if endpoint && len(args) != 1 {
				return fail(exitUsage, "--endpoint takes one service name")
			}
			// Every replica, ended ones too: -a shows them, and the table counts them without
			// it. --json alone answers what the control plane manages, as before.
			query := "?all=1"
			if asJSON && !all {
				query = ""
			}
			c, _, err := connect(cmd.Context(), g.home, g.api)
			if err != nil {
				return err
			}
			svcs, err := fetchFrom(cmd.Context(), c, args, query)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if endpoint {
				// Just the URL, as `sky serve status --endpoint` prints it, for scripts.
				fmt.Fprintln(out, svcs[0].Endpoint)
				return nil
			}
			ended := 0
			if !all && !asJSON {
				svcs, ended = liveOnly(svcs)
			}
			if asJSON {
				return writeJSON(out, svcs)
			}
			if len(svcs) == 0 {
				fmt.Fprintln(out, "No services. Start one with `serve up FILE`.")
				return nil
			}
			// Everything is fetched before anything is printed: a reader that stops early
			// (grep -q) must not find the output paused on a network call.
			var tenants *fleet.LoadAnswer
			if len(args) == 0 {
				tenants = fetchTenants(cmd.Context(), c)
			}
			fmt.Fprintln(out, "Services")
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tUPTIME\tSTATUS\tREPLICAS\tSPOT\t$/HOUR\t$ SO FAR\tTOKENS\t$/M TOKENS\tENDPOINT")
			for _, s := range svcs {
				perM := "-"
				if s.Tokens > 0 {
					perM = fmt.Sprintf("%.4f", s.DollarsPerMillionTokens)
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d/%d\t%s\t%.2f\t%.4f\t%.0f\t%s\t%s\n", s.Name, s.Version, since(s.CreatedAt), s.Status, s.Ready, s.Target,
					spotShare(s), s.DollarsPerHour, s.Dollars, s.Tokens, perM, s.Endpoint)
			}
			tw.Flush()
			printAdapters(out, svcs)
			if tenants != nil {
				writeTenants(out, *tenants)
			}
			for _, s := range svcs {
				if s.Failed != "" {
					fmt.Fprintf(out, "  %s: failed: %s (fix it with `serve update %s FILE`, or remove it with `serve down %s`)\n", s.Name, s.Failed, s.Name, s.Name)
				}
				if s.Offers != "" {
					fmt.Fprintf(out, "  %s: offers missing: %s\n", s.Name, s.Offers)
				}
				for _, m := range s.ModelConflicts {
					fmt.Fprintf(out, "  %s: model conflict: %s\n", s.Name, m)
				}
			}
			if verbose {
				for _, s := range svcs {
					fmt.Fprintf(out, "  %s: models %v; autoscaler: %s\n", s.Name, s.Models, dash(s.Decision))
					if s.Placement != "" {
						fmt.Fprintf(out, "  %s: placement: %s\n", s.Name, s.Placement)
					}
				}
			}
			fmt.Fprintln(out, "\nReplicas")
			printReplicas(out, svcs)
			if ended > 0 {
				fmt.Fprintf(out, "(%d ended replicas not shown: -a lists every replica)\n", ended)
			}
			if verbose {
				for _, s := range svcs {
					for _, r := range s.Replicas {
						fmt.Fprintf(out, "  %s: %s\n", r.ID, dash(r.Reason))
					}
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "machine-readable output")
	cmd.Flags().BoolVar(&endpoint, "endpoint", false, "print only the service's endpoint URL")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "also the autoscaler's last decision and each replica's last transition reason")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "every replica, ended ones too (default: the live ones)")
	return cmd
}

// spotShare is the share of a service's ready replicas on spot, as ready spot/ready.
func spotShare(s control.ServiceStatus) string {
	ready, spot := 0, 0
	for _, r := range s.Replicas {
		if r.State == "ready" {
			ready++
			if r.Capacity == "spot" {
				spot++
			}
		}
	}
	if ready == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d", spot, ready)
}

// liveOnly drops the replicas that ended (terminated, their bill closed), and counts them.
func liveOnly(svcs []control.ServiceStatus) ([]control.ServiceStatus, int) {
	out := make([]control.ServiceStatus, len(svcs))
	ended := 0
	for i, s := range svcs {
		live := s.Replicas[:0:0]
		for _, r := range s.Replicas {
			if r.EndedAt.IsZero() {
				live = append(live, r)
			} else {
				ended++
			}
		}
		s.Replicas = live
		out[i] = s
	}
	return out, ended
}

func replicasCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "replicas [NAME...]",
		Short: "List replicas: where they run, what they cost, their state",
		RunE: func(cmd *cobra.Command, args []string) error {
			svcs, err := fetch(cmd.Context(), g, args)
			if err != nil {
				return err
			}
			if asJSON {
				var all []any
				for _, s := range svcs {
					for _, r := range s.Replicas {
						all = append(all, r)
					}
				}
				if all == nil {
					all = []any{}
				}
				return writeJSON(cmd.OutOrStdout(), all)
			}
			printReplicas(cmd.OutOrStdout(), svcs)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "machine-readable output")
	return cmd
}

func fetch(ctx context.Context, g *globals, names []string) ([]control.ServiceStatus, error) {
	c, _, err := connect(ctx, g.home, g.api)
	if err != nil {
		return nil, err
	}
	return fetchFrom(ctx, c, names, "")
}

// fetchFrom is fetch from a control plane connected already, with a query on each call
// (?all=1: ended replicas too).
func fetchFrom(ctx context.Context, c *client, names []string, query string) ([]control.ServiceStatus, error) {
	if len(names) == 0 {
		return c.servicesWith(ctx, query)
	}
	var out []control.ServiceStatus
	for _, n := range names {
		s, err := c.serviceWith(ctx, n, query)
		if notFound(err) {
			return nil, fail(exitErr, "no service named %q (`serve status` lists them)", n)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func printReplicas(out io.Writer, svcs []control.ServiceStatus) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tID\tVERSION\tPROVIDER\tREGION/ZONE\tCAPACITY\tGPU\t$/HOUR\t$/M TOKENS AT SLO\tSTATUS\tLAUNCHED\tENDPOINT\tPRICED BY")
	for _, s := range svcs {
		for _, r := range s.Replicas {
			gpu := dash(r.Accelerator)
			id := r.ID
			if r.Adapter != "" {
				id += " (" + r.Adapter + "'s own)" // serves the adapter merged (issue 51)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s/%s\t%s\t%s\t%.2f\t%s\t%s\t%s ago\t%s\t%s\n", s.Name, id, r.Version, r.Provider, dash(r.Region), dash(r.Zone),
				dash(r.Capacity), gpu, r.PricePerHour, predictedPerM(s, r.ID), r.State, since(r.LaunchedAt), dash(r.Address), priceSource(r.PriceSource))
		}
	}
	tw.Flush()
}

// predictedPerM is a replica's predicted $ per million tokens at its service's SLO, from its
// GPU's profile and the service's request mix: "-" where not known (no GPU or no profile),
// "misses SLO" where the GPU cannot meet it for the mix.
func predictedPerM(s control.ServiceStatus, id string) string {
	pt, ok := s.PerToken[id]
	switch {
	case !ok:
		return "-"
	case pt.TokensPerSecond <= 0:
		return "misses SLO"
	}
	return fmt.Sprintf("%.4f", pt.DollarsPerMillionTokens)
}

// priceSource names where a price came from, briefly: a catalog by its file, an API by
// its call; "-" where the provider does not say (the local machine's price is the spec's).
func priceSource(s string) string {
	if file, ok := strings.CutPrefix(s, "catalog:"); ok {
		return "catalog " + path.Base(file)
	}
	return dash(s)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func since(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t).Round(time.Second)
	switch {
	case d < time.Minute:
		return d.String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func logsCmd(g *globals) *cobra.Command {
	var follow, noFollow bool
	var tail int
	cmd := &cobra.Command{
		Use:   "logs NAME [REPLICA] [--tail N] [--follow | --no-follow]",
		Short: "Show a service's control-plane events, or a replica's own output",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if follow && noFollow {
				return fail(exitUsage, "give --follow or --no-follow, not both")
			}
			if tail < 0 {
				return fail(exitUsage, "--tail %d: want a number of lines >= 0 (0: all)", tail)
			}
			ctx := cmd.Context()
			c, _, err := connect(ctx, g.home, g.api)
			if err != nil {
				return err
			}
			if _, err := c.service(ctx, args[0]); notFound(err) {
				return fail(exitErr, "no service named %q", args[0])
			}
			out := cmd.OutOrStdout()
			if len(args) == 1 {
				var after int64
				for first := true; ; first = false {
					ev, err := c.events(ctx, args[0], "", after)
					if err != nil {
						return err
					}
					if first && tail > 0 && len(ev) > tail {
						ev = ev[len(ev)-tail:]
					}
					for _, e := range ev {
						fmt.Fprintf(out, "%s  %-14s %-8s %s\n", e.At.Format(time.RFC3339), dash(e.Replica), e.Kind, e.Message)
						after = e.ID
					}
					if !follow {
						return nil
					}
					if !sleep(ctx, 500*time.Millisecond) {
						return nil
					}
				}
			}
			var off int64
			var kept []byte // with --tail: the last lines of what is read so far, until the end
			for catchingUp := tail > 0; ; {
				var b []byte
				h, err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/logs/%s?offset=%d", args[1], off), nil, &b)
				if notFound(err) {
					return fail(exitErr, "no log for replica %q of %s", args[1], args[0])
				}
				if err != nil {
					return err
				}
				if n, err := strconv.ParseInt(h.Get("X-Log-Offset"), 10, 64); err == nil {
					off = n
				}
				if catchingUp {
					// The API answers a long log a chunk at a time: read to its end first.
					if kept = lastLines(append(kept, b...), tail); len(b) > 0 {
						continue
					}
					b, catchingUp = kept, false
				}
				_, _ = out.Write(b)
				if !follow {
					return nil
				}
				if len(b) == 0 && !sleep(ctx, 500*time.Millisecond) {
					return nil
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new lines")
	cmd.Flags().BoolVar(&noFollow, "no-follow", false, "print what there is and return (the default)")
	cmd.Flags().IntVar(&tail, "tail", 0, "start with only the last N lines (0: all)")
	return cmd
}

// lastLines is the last n lines of b (a last line without its newline counts).
func lastLines(b []byte, n int) []byte {
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	for i := end - 1; i >= 0; i-- {
		if b[i] == '\n' {
			if n--; n == 0 {
				return b[i+1:]
			}
		}
	}
	return b
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// fetchTenants is the tenants' spend (issue 52), or nil when no tenant spent anything:
// what the routers' budgets are checked against. A control plane that does not answer it
// (an older version) gives nil.
func fetchTenants(ctx context.Context, c *client) *fleet.LoadAnswer {
	var ans fleet.LoadAnswer
	if _, err := c.do(ctx, http.MethodGet, "/v1/tenants", nil, &ans); err != nil || len(ans.Tenants) == 0 {
		return nil
	}
	return &ans
}

func writeTenants(out io.Writer, ans fleet.LoadAnswer) {
	fmt.Fprintf(out, "\nTenants (spend at the replicas' $ per token; UTC day %s and its month)\n", ans.Day)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\t$ TODAY\t$ THIS MONTH\tTOKENS TODAY\tTOKENS THIS MONTH")
	for _, t := range ans.Tenants {
		fmt.Fprintf(tw, "%s\t%.4f\t%.4f\t%.0f\t%.0f\n", t.Tenant, t.DayDollars, t.MonthDollars, t.DayTokens, t.MonthTokens)
	}
	tw.Flush()
}

// printAdapters lists each service's LoRA adapters with their use and cost, if any has one.
func printAdapters(out io.Writer, svcs []control.ServiceStatus) {
	n := 0
	for _, s := range svcs {
		n += len(s.Adapters)
	}
	if n == 0 {
		return
	}
	fmt.Fprintln(out, "\nAdapters ($ at the service's $ per token)")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tADAPTER\tREQUESTS\tTOKENS\t$ SO FAR")
	for _, s := range svcs {
		for _, a := range s.Adapters {
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.4f\n", s.Name, a.Name, a.Requests, a.Tokens, a.Dollars)
		}
	}
	tw.Flush()
}

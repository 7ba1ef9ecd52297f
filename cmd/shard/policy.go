package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

func newPolicyCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "policy",
		Aliases: []string{"policies"},
		Short:   "A sandbox's egress network policy: set, show, clear",
		Long: `A sandbox's egress policy says where it may connect to. Without one, all
egress is allowed but the server's egress boundary, which no policy opens:
this node's and the cluster's addresses, link-local (169.254.0.0/16),
loopback, and private ranges (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16,
100.64.0.0/10) unless shard serve --allow-private-egress opens them. A
policy that allows into the boundary is refused.

Entries are IPv4 addresses (93.184.215.14), CIDRs (198.51.100.0/24) or domain
names: example.org means it and its subdomains, *.example.org only its
subdomains. Deny wins over allow. With --deny-all, or any --allow entry,
whatever is not allowed is denied; with only --deny entries, the rest is
allowed.

The policy is enforced outside the sandbox, so nothing inside can lift it:
addresses and CIDRs by nftables on the host, domain names through the
server's DNS proxy, which is how the sandbox resolves names. A change
applies at once to new connections; the policy holds across stop and start,
and a fork gets a copy (forking a sandbox that has a policy needs a key with
policy:*).`,
		Example: `  shard policy set base --deny-all --allow pypi.org --allow files.pythonhosted.org
  shard policy set base --deny 198.51.100.0/24
  shard policy show base
  shard policy clear base`,
	}

	var denyAll bool
	var allow, deny []string
	set := &cobra.Command{
		Use:   "set SANDBOX [--deny-all] [--allow HOST|CIDR]... [--deny HOST|CIDR]...",
		Short: "Set a sandbox's egress policy, replacing the whole of it",
		Long: `Set SANDBOX's egress policy to exactly what the flags say; the policy it had
is replaced, not added to. See shard policy --help for what entries mean.
To remove the policy, use shard policy clear.`,
		Example: `  shard policy set base --deny-all                           # no egress at all
  shard policy set base --allow pypi.org --allow files.pythonhosted.org
  shard policy set base --allow '*.githubusercontent.com' --deny gist.githubusercontent.com`,
		Args: exactArgs(1, "a SANDBOX (id or name)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := policyFromFlags(denyAll, allow, deny)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			got, err := c.SetPolicy(cmd.Context(), args[0], p)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(got)
			}
			termsafe.Println(args[0]) // as policy clear, stop and rm say what they changed
			return nil
		},
	}
	set.Flags().BoolVar(&denyAll, "deny-all", false, "deny all egress that is not allowed")
	set.Flags().StringSliceVar(&allow, "allow", nil, "allow an IPv4 address, CIDR or domain (repeatable, or comma-separated)")
	set.Flags().StringSliceVar(&deny, "deny", nil, "deny an IPv4 address, CIDR or domain (repeatable, or comma-separated)")
	set.Flags().BoolVar(&a.json, "json", false, "print the policy as JSON")

	show := &cobra.Command{
		Use:     "show SANDBOX",
		Aliases: []string{"get", "inspect"},
		Short:   "Show a sandbox's egress policy",
		Example: `  shard policy show base`,
		Args:    exactArgs(1, "a SANDBOX (id or name)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			p, err := c.GetPolicy(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(p)
			}
			writePolicy(os.Stdout, *p)
			return nil
		},
	}
	show.Flags().BoolVar(&a.json, "json", false, "print JSON")

	clr := eachArg(a, "clear SANDBOX...", "Remove sandboxes' egress policies: all egress is allowed again", "one or more SANDBOX (id or name)",
		func(ctx context.Context, c *client.Client, id string) (any, error) {
			return map[string]string{"cleared": id}, c.ClearPolicy(ctx, id)
		})
	clr.Example = `  shard policy clear base`

	cmd.AddCommand(set, show, clr)
	return cmd
}

// policyFromFlags makes the policy policy set sends: entries trimmed, each
// once, in the order given. A policy with nothing in it is refused (that is
// policy clear).
func policyFromFlags(denyAll bool, allow, deny []string) (client.Policy, error) {
	p := client.Policy{DenyAll: denyAll}
	var err error
	if p.Allow, err = policyEntries("--allow", allow); err != nil {
		return p, err
	}
	if p.Deny, err = policyEntries("--deny", deny); err != nil {
		return p, err
	}
	if !p.DenyAll && len(p.Allow) == 0 && len(p.Deny) == 0 {
		return p, fmt.Errorf("policy set needs --deny-all, --allow or --deny (to remove a policy: shard policy clear)")
	}
	return p, nil
}

func policyEntries(flag string, in []string) ([]string, error) {
	var out []string
	for _, e := range in {
		e = strings.TrimSpace(e)
		if e == "" {
			return nil, fmt.Errorf("%s: an empty entry (give an IPv4 address, a CIDR or a domain)", flag)
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out, nil
}

// writePolicy prints a policy for people: one line each for deny-all,
// allow, deny and what happens to the rest; or that there is none.
func writePolicy(w io.Writer, p client.Policy) {
	if !p.DenyAll && len(p.Allow) == 0 && len(p.Deny) == 0 {
		termsafe.Fprintln(w, "no policy: all egress allowed")
		return
	}
	yesNo := map[bool]string{true: "yes", false: "no"}
	list := func(l []string) string {
		if len(l) == 0 {
			return "-"
		}
		return strings.Join(l, " ")
	}
	rest := "allowed"
	if p.DenyAll || len(p.Allow) > 0 {
		rest = "denied"
	}
	termsafe.Fprintf(w, "deny-all: %s\nallow: %s\ndeny: %s\nanything else: %s\n", yesNo[p.DenyAll], list(p.Allow), list(p.Deny), rest)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
	"golang.org/x/term"
)

// maxSecretInput bounds what secret set reads (the server takes at most
// 256 KiB; reading more would only be thrown away).
const maxSecretInput = 1 << 20

func newSecretCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "secret",
		Aliases: []string{"secrets"},
		Short:   "Named secrets that sandboxes are granted: set, ls, rm",
		Long: `A secret is a named value the server keeps encrypted. No endpoint and no
verb ever shows a value again: 'shard secret ls' lists names and times.
'shard grant SANDBOX SECRET' gives one to a sandbox, as an environment
variable of its execs or as a file.

Values come from stdin or from a file, never from the command line, where
other users could read them (ps, /proc) and the shell would keep them in its
history.`,
		Example: `  shard secret set OPENAI_API_KEY            # prompts, without echo
  printf %s "$TOKEN" | shard secret set GH_TOKEN
  shard secret set tls.key --from-file ./tls.key
  shard grant base OPENAI_API_KEY
  shard secret ls`,
	}

	var fromFile string
	set := &cobra.Command{
		Use:   "set NAME [--from-file PATH]",
		Short: "Set a secret from stdin or a file (never from an argument)",
		Long: `Store a secret's value under NAME, replacing the value it had (sandboxes with
an env grant get the new value at their next exec; a granted file is not
rewritten until it is granted again).

The value is read from --from-file PATH, or else from stdin: all of it, as
it is (a trailing newline is part of the value: use printf %s, not echo).
When stdin is a terminal, shard asks for the value and reads one line
without echoing it. At most 256 KiB; an empty value is refused.

There is no way to give the value as an argument: arguments can be read by
every user on the machine (ps, /proc) and are kept in the shell's history.`,
		Example: `  shard secret set OPENAI_API_KEY
  printf %s "$TOKEN" | shard secret set GH_TOKEN
  shard secret set tls.key --from-file ./tls.key`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 0:
				return fmt.Errorf("secret set takes a NAME; the value comes from stdin or --from-file")
			case len(args) > 1:
				return fmt.Errorf("secret set takes the value from stdin or --from-file, never as an argument: other users can read arguments (ps, /proc) and the shell keeps them in its history; try: shard secret set %s (it asks for the value), shard secret set %s --from-file FILE, or pipe the value in", args[0], args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			var value []byte
			var err error
			switch {
			case fromFile != "":
				var f *os.File
				if f, err = os.Open(fromFile); err != nil {
					return err
				}
				value, err = readSecret(f)
				f.Close()
				if err != nil {
					err = fmt.Errorf("--from-file %s: %w", fromFile, err)
				}
			case term.IsTerminal(int(os.Stdin.Fd())):
				value, err = promptSecret(name)
			default:
				if value, err = readSecret(os.Stdin); err != nil {
					err = fmt.Errorf("stdin: %w", err)
				}
			}
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sec, err := c.SetSecret(cmd.Context(), name, value)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(sec)
			}
			return nil
		},
	}
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file instead of stdin")
	set.Flags().BoolVar(&a.json, "json", false, "print the secret's record (never its value) as JSON")

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List secrets: names and times, never values",
		Example: `  shard secret ls`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			secs, err := c.Secrets(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(secs)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "NAME\tCREATED\tUPDATED\n")
			for _, s := range secs {
				termsafe.Fprintf(tw, "%s\t%s\t%s\n", s.Name, ago(s.CreatedAt), ago(s.UpdatedAt))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&a.json, "json", false, "print JSON")

	rm := eachArg(a, "rm NAME...", "Remove secrets", "one or more secret NAME",
		func(ctx context.Context, c *client.Client, name string) (any, error) {
			return map[string]string{"removed": name}, c.RemoveSecret(ctx, name)
		})
	rm.Aliases = []string{"remove"}
	rm.Long = `Remove secrets. Sandboxes they were granted to keep a file already written;
an env grant gives nothing to their later execs.`
	rm.Example = `  shard secret rm GH_TOKEN`

	cmd.AddCommand(set, ls, rm)
	return cmd
}

// readSecret reads a secret's value: all of r, as it is, refusing an empty
// value and one larger than maxSecretInput.
func readSecret(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxSecretInput+1))
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, errors.New("the value is empty")
	}
	if len(b) > maxSecretInput {
		return nil, fmt.Errorf("the value is larger than %d bytes", maxSecretInput)
	}
	return b, nil
}

// promptSecret asks for a secret's value on the terminal and reads one line
// without echo.
func promptSecret(name string) ([]byte, error) {
	termsafe.Fprintf(os.Stderr, "value for %s: ", name)
	b, err := term.ReadPassword(int(os.Stdin.Fd()))
	termsafe.Fprintln(os.Stderr)
	if err != nil {
		return nil, fmt.Errorf("read the value: %w", err)
	}
	if len(b) == 0 {
		return nil, errors.New("the value is empty")
	}
	return b, nil
}

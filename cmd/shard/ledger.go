package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/shellquote"
	"github.com/useshards/shard/internal/termsafe"
	"github.com/useshards/shard/internal/units"
)

// eventsPage is how many events `shard ledger` asks for at a time.
const eventsPage = 1000

func newLedgerCmd(a *app) *cobra.Command {
	var follow bool
	var after int64
	cmd := &cobra.Command{
		Use:   "ledger [--follow] [--after N] SESSION",
		Short: "Show a ledger session's events; ledger ls lists the sessions",
		Long: `Every sandbox records what happens to it in a ledger session: its create,
each exec (argv, working directory, user, the names of its environment
variables but never their values) and how it finished, checkpoints, forks,
stops, starts and its removal. A session is named after its sandbox (NAME-2,
NAME-3... when an earlier sandbox had that name; fork-PARENT-ID for a fork)
and outlives it: shard resume recreates a sandbox from one. SESSION is a
sandbox's name or id (a removed sandbox's by id) or a session's name; a live
sandbox's name wins over a session's (an earlier sandbox's session is then
reached by that sandbox's id).

Each event is one line: SEQ  TIME  TYPE  key=value ... --json prints each
event as one line of JSON instead. --follow keeps printing new events as they
are recorded, until the session's sandbox is removed (or Ctrl-C). --after N
starts after sequence number N.`,
		Example: `  shard ledger ls
  shard ledger base
  shard ledger my-fork          # its session is fork-base-1a2b3c
  shard ledger --follow base
  shard ledger --json --after 40 base | jq .type`,
		Args: exactArgs(1, "a SESSION (shard ledger ls lists them)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if after < 0 {
				return fmt.Errorf("--after must be 0 or more")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			emit := eventPrinter(os.Stdout, a.json, time.Local)
			if follow {
				err := c.FollowEvents(ctx, args[0], after, emit)
				if ctx.Err() != nil {
					return nil // Ctrl-C ends a follow; that is no failure
				}
				return err
			}
			for {
				page, err := c.Events(ctx, args[0], after, eventsPage)
				if err != nil {
					return err
				}
				for _, ev := range page.Events {
					if err := emit(ev); err != nil {
						return err
					}
				}
				if !page.More {
					return nil
				}
				if page.Next <= after {
					return fmt.Errorf("the server said there are more events after %d but gave no next page", after)
				}
				after = page.Next
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events until the sandbox is removed")
	cmd.Flags().Int64Var(&after, "after", 0, "only events with a sequence number above N")
	cmd.Flags().BoolVar(&a.json, "json", false, "print one JSON event per line (NDJSON)")

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List ledger sessions, those of removed sandboxes too",
		Example: `  shard ledger ls
  shard ledger ls --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			sessions, err := c.Sessions(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(sessions)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			termsafe.Fprintf(tw, "NAME\tSANDBOX\tEVENTS\tLAST-EVENT\tLAST-AT\tCREATED\n")
			for _, s := range sessions {
				sb := s.SandboxName
				if sb == "" {
					sb = "(removed)"
				}
				termsafe.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", s.Name, sb, s.Events, dash(s.LastEvent), ago(s.LastAt), ago(s.CreatedAt))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&a.json, "json", false, "print JSON")
	rm := eachArg(a, "rm SESSION...", "Remove ledger sessions (by name, or their removed sandbox's id) and their events: only once the session's sandbox is removed and its checkpoints are (shard checkpoint rm)", "one or more SESSION name",
		func(ctx context.Context, c *client.Client, name string) (any, error) {
			return map[string]string{"removed": name}, c.RemoveSession(ctx, name)
		})
	rm.Aliases = []string{"remove"}
	rm.Example = `  shard ledger rm job-2`
	cmd.AddCommand(ls, rm)
	return cmd
}

// eventPrinter returns what prints each event to w: a line of text, or with
// asJSON one line of JSON.
func eventPrinter(w io.Writer, asJSON bool, loc *time.Location) func(client.Event) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false) // argv like "a > b" stays readable
		return func(ev client.Event) error { return enc.Encode(ev) }
	}
	return func(ev client.Event) error {
		_, err := termsafe.Fprintln(w, formatEvent(ev, loc))
		return err
	}
}

// formatEvent renders an event as one line: SEQ  TIME  TYPE  key=value ...
func formatEvent(ev client.Event, loc *time.Location) string {
	line := fmt.Sprintf("%-4d  %s  %-26s  %s", ev.Seq, ev.At.In(loc).Format("2006-01-02 15:04:05.000"), ev.Type, formatData(ev.Data))
	return strings.TrimRight(line, " ")
}

// dataOrder is the order of the data fields formatData knows; others come
// after them, sorted.
var dataOrder = []string{
	"exec", "argv", "cwd", "user", "env_names", "tty", "stdin", "timeout_ms", "replay",
	"exit_code", "signal", "timed_out", "oom_killed", "duration_ms", "error",
	"checkpoint", "snapshot", "kind", "tag", "freeze_ms", "fork", "name",
	"image", "digest", "provider", "memory_bytes", "cpu_millis", "disk_bytes", "pids",
	"forked_from", "parent_name", "restored_from", "resumed_from", "from_snapshot", "environment",
	"reason",
}

// formatData renders an event's data compactly as key=value pairs: argv as
// one shell-quoted command line, sizes in units, digests shortened, false,
// empty and null values left out. Data that is not an object is printed as
// it is.
func formatData(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return string(raw)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	rank := func(k string) int {
		if i := slices.Index(dataOrder, k); i >= 0 {
			return i
		}
		return len(dataOrder)
	}
	sort.Slice(keys, func(i, j int) bool {
		ri, rj := rank(keys[i]), rank(keys[j])
		if ri != rj {
			return ri < rj
		}
		return keys[i] < keys[j]
	})
	var parts []string
	for _, k := range keys {
		if v, ok := formatValue(k, m[k]); ok {
			parts = append(parts, k+"="+v)
		}
	}
	return strings.Join(parts, " ")
}

// formatValue renders one data field; ok is false for what is left out.
func formatValue(key string, v any) (string, bool) {
	switch v := v.(type) {
	case nil:
		return "", false
	case bool:
		return "true", v
	case string:
		if v == "" {
			return "", false
		}
		if key == "digest" || strings.HasPrefix(v, "sha256:") && len(v) > 19 {
			v = v[:min(len(v), 19)]
		}
		return quoteValue(v), true
	case json.Number:
		if key == "signal" && v.String() == "0" {
			return "", false
		}
		if n, err := v.Int64(); err == nil && strings.HasSuffix(key, "_bytes") && n > 0 {
			return units.FormatSize(n), true
		}
		return v.String(), true
	case []any:
		if len(v) == 0 {
			return "", false
		}
		strs := make([]string, len(v))
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				b, _ := json.Marshal(v)
				return string(b), true
			}
			strs[i] = s
		}
		if key == "argv" {
			return quoteValue(shellquote.Join(strs)), true
		}
		return quoteValue(strings.Join(strs, ",")), true
	}
	b, _ := json.Marshal(v)
	return string(b), true
}

// quoteValue quotes a value that would not read back as one word: empty,
// or with a space, a quote, a backslash, '=' or an unprintable rune.
func quoteValue(s string) string {
	if s == "" || strings.IndexFunc(s, func(r rune) bool {
		return !strconv.IsPrint(r) || strings.ContainsRune(" \"'\\=", r)
	}) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// dash stands in for an empty table cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

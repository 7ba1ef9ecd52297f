package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/shellquote"
	"github.com/useshards/shard/internal/termsafe"
)

func newResumeCmd(a *app) *cobra.Command {
	var req client.ResumeRequest
	cmd := &cobra.Command{
		Use:   "resume [--name NAME] SESSION",
		Short: "Recreate a sandbox from its ledger session, replaying its execs; prints the new id",
		Long: `Resume a ledger session (shard ledger ls), also one whose sandbox was removed.
SESSION is a session's name, or its sandbox's name or id (a removed sandbox's
by id).
The new sandbox starts from the session's latest checkpoint that still exists
(its own, or the one its sandbox was forked or restored from). With none, it
is a fresh sandbox of the session's image and bounds (from its snapshot, if it
had one); but a session that began from a checkpoint since removed has
nothing to start from. Then the execs the ledger recorded after that point
run again, in order:

  - one that finished is run again and waited for, whatever its exit code was
    or is now: replay goes on;
  - one that never finished is started again and left running;
  - stdin is empty, and per-exec environment values are not replayed (the
    ledger keeps only their names): the sandbox's own environment applies.

Secret grants and network policy changes recorded after that point are made
again too, in their place among the execs, so a replayed exec gets the
grants it had (needs the secret and policy scopes, as a fork does).

The new sandbox has a new id and its own session (named by --name, or its
id). Its id is printed on stdout; each replayed exec is reported on stderr:

  replayed: pip install requests (exit 0)
  replayed: python3 server.py (left running)
  replayed: make test (was exit 1, now exit 0)
  reapplied: secret_granted OPENAI_KEY

'shard restore CHECKPOINT' is the same start without the replay.`,
		Example: `  shard resume base
  shard resume --name base-2 --json base`,
		Args: exactArgs(1, "a SESSION (shard ledger ls lists them)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.Resume(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if a.json {
				return printJSON(res)
			}
			for _, r := range res.Replayed {
				termsafe.Fprintln(os.Stderr, formatReplayed(r))
			}
			for _, r := range res.Reapplied {
				termsafe.Fprintln(os.Stderr, formatReapplied(r))
			}
			termsafe.Println(res.Sandbox.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Name, "name", "", "name of the new sandbox (unique); default: its id")
	cmd.Flags().BoolVar(&a.json, "json", false, "print the answer (sandbox, checkpoint, replayed execs) as JSON")
	return cmd
}

// formatReapplied is the line resume prints for one grant or policy change
// made again.
func formatReapplied(r client.ReappliedChange) string {
	what := strings.TrimPrefix(r.Event, "sandbox.")
	if r.Secret != "" {
		what += " " + r.Secret
	}
	if r.Error != "" {
		return fmt.Sprintf("reapplied: %s (failed: %s)", what, r.Error)
	}
	return "reapplied: " + what
}

// formatReplayed is the line resume prints for one replayed exec.
func formatReplayed(r client.ReplayedExec) string {
	var how string
	switch {
	case r.Error != "" && r.RecordedExit != nil:
		how = fmt.Sprintf("was exit %d, now failed: %s", *r.RecordedExit, r.Error)
	case r.Error != "":
		how = "failed: " + r.Error
	case r.ExitCode == nil:
		how = "left running"
	case r.RecordedExit != nil && *r.RecordedExit != *r.ExitCode:
		how = fmt.Sprintf("was exit %d, now exit %d", *r.RecordedExit, *r.ExitCode)
	default:
		how = fmt.Sprintf("exit %d", *r.ExitCode)
	}
	return fmt.Sprintf("replayed: %s (%s)", shellquote.Join(r.Argv), how)
}

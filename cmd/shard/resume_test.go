package main

import (
	"testing"

	"github.com/useshards/shard/client"
)

func TestFormatReplayed(t *testing.T) {
	code := func(n int) *int { return &n }
	argv := []string{"pip", "install", "x"}
	for _, tc := range []struct {
		name string
		r    client.ReplayedExec
		want string
	}{
		{"same exit", client.ReplayedExec{Argv: argv, RecordedExit: code(0), ExitCode: code(0)}, "replayed: pip install x (exit 0)"},
		{"same non-zero exit", client.ReplayedExec{Argv: argv, RecordedExit: code(2), ExitCode: code(2)}, "replayed: pip install x (exit 2)"},
		{"exit changed", client.ReplayedExec{Argv: argv, RecordedExit: code(1), ExitCode: code(0)}, "replayed: pip install x (was exit 1, now exit 0)"},
		{"never finished, left running", client.ReplayedExec{Argv: []string{"python3", "-m", "http.server"}}, "replayed: python3 -m http.server (left running)"},
		{"could not start", client.ReplayedExec{Argv: argv, RecordedExit: code(0), Error: "command not found"}, "replayed: pip install x (was exit 0, now failed: command not found)"},
		{"unfinished and could not start", client.ReplayedExec{Argv: argv, Error: "sandbox does not answer"}, "replayed: pip install x (failed: sandbox does not answer)"},
		{"quoted argv", client.ReplayedExec{Argv: []string{"sh", "-c", "echo hi"}, RecordedExit: code(0), ExitCode: code(0)}, "replayed: sh -c 'echo hi' (exit 0)"},
	} {
		if got := formatReplayed(tc.r); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}

func TestFormatReapplied(t *testing.T) {
	for _, tc := range []struct {
		r    client.ReappliedChange
		want string
	}{
		{client.ReappliedChange{Event: "sandbox.secret_granted", Secret: "KEY"}, "reapplied: secret_granted KEY"},
		{client.ReappliedChange{Event: "sandbox.policy_set"}, "reapplied: policy_set"},
		{client.ReappliedChange{Event: "sandbox.secret_granted", Secret: "GONE", Error: "secret GONE not found"}, "reapplied: secret_granted GONE (failed: secret GONE not found)"},
	} {
		if got := formatReapplied(tc.r); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.r, got, tc.want)
		}
	}
}

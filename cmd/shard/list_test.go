package main

import (
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// TestWriteSandboxLists: inspect names a list (Env, Grants, Policy) once,
// on its first line; the lines after it are the values alone, with no stray
// colon where the key would be.
func TestWriteSandboxLists(t *testing.T) {
	sb := &client.Sandbox{
		ID:     "abc",
		Env:    []string{"A=1", "B=2", "C=3"},
		Grants: []client.Grant{{Secret: "KEY"}, {Secret: "tls.key", File: "/etc/tls.key"}},
		Policy: &client.Policy{Allow: []string{"example.com"}},
	}
	var b strings.Builder
	if err := writeSandbox(&b, sb, false); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), ":") {
			t.Errorf("line %q starts with a stray colon", l)
		}
		got[strings.Join(strings.Fields(l), " ")] = true
	}
	for _, want := range []string{
		"Env: A=1", "B=2", "C=3",
		"Grants: KEY as $KEY", "tls.key as the file /etc/tls.key",
		"Policy: deny-all: no", "allow: example.com", "deny: -", "anything else: denied",
	} {
		if !got[want] {
			t.Errorf("no line %q in:\n%s", want, b.String())
		}
	}
}

// TestWriteSandboxOrigin: inspect says what a sandbox came from by name; an
// environment's sandbox once showed its setup sandbox's id, removed at once.
func TestWriteSandboxOrigin(t *testing.T) {
	for _, tc := range []struct {
		sb            client.Sandbox
		parentRemoved bool
		want, not     string
	}{
		{client.Sandbox{ParentID: "f079a4ceae7d", Origin: &client.Origin{Kind: "environment", Name: "py-deps", Checkpoint: "ck1"}}, false, "Origin: environment py-deps", "f079a4ceae7d"},
		{client.Sandbox{Origin: &client.Origin{Kind: "snapshot", Name: "base-v1", ID: "sn1"}}, false, "Origin: snapshot base-v1", "Parent"},
		{client.Sandbox{ParentID: "b1", Origin: &client.Origin{Kind: "fork", Name: "base", ID: "b1", Checkpoint: "ck2"}}, false, "Origin: fork of base (checkpoint ck2)", "Parent"},
		{client.Sandbox{Origin: &client.Origin{Kind: "image", Name: "python:3.12-slim"}}, false, "Origin: image python:3.12-slim", "Parent"},
		{client.Sandbox{ParentID: "b1", Origin: &client.Origin{Kind: "checkpoint", Name: "before", ID: "ck3"}}, false, "Origin: checkpoint before (ck3)", "Parent"},
		{client.Sandbox{ParentID: "b1", Origin: &client.Origin{Kind: "session", Name: "s1", Checkpoint: "ck4"}}, false, "Origin: resume of session s1 (checkpoint ck4)", "Parent"},
		// A sandbox of an older server: its parent's id, said to be gone.
		{client.Sandbox{ParentID: "f079a4ceae7d"}, true, "Parent: f079a4ceae7d (removed)", "Origin"},
		{client.Sandbox{ParentID: "f079a4ceae7d"}, false, "Parent: f079a4ceae7d", "removed"},
	} {
		var b strings.Builder
		if err := writeSandbox(&b, &tc.sb, tc.parentRemoved); err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, l := range strings.Split(b.String(), "\n") {
			lines = append(lines, strings.Join(strings.Fields(l), " "))
		}
		out := strings.Join(lines, "\n")
		if !strings.Contains(out, "\n"+tc.want+"\n") {
			t.Errorf("no line %q in:\n%s", tc.want, out)
		}
		if strings.Contains(out, tc.not) {
			t.Errorf("%q in:\n%s", tc.not, out)
		}
	}
}

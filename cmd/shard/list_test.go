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
	if err := writeSandbox(&b, sb); err != nil {
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

package main

import (
	"strings"
	"testing"

	"github.com/useshards/shard/internal/auth"
)

func TestScopeHelp(t *testing.T) {
	help := scopeHelp()
	for _, s := range auth.Known {
		if scopeDoc[s] == "" {
			t.Errorf("scope %s has no line in scopeDoc", s)
		}
		if !strings.Contains(help, "  "+s+" ") {
			t.Errorf("the help does not list %s:\n%s", s, help)
		}
	}
	for s := range scopeDoc {
		if !auth.Valid(s) {
			t.Errorf("scopeDoc describes %s, which is not in auth.Known", s)
		}
	}
}

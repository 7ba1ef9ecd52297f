package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

func TestPolicyFromFlags(t *testing.T) {
	for _, tc := range []struct {
		name        string
		denyAll     bool
		allow, deny []string
		want        client.Policy
		wantErr     string
	}{
		{name: "deny all", denyAll: true, want: client.Policy{DenyAll: true}},
		{name: "allow list", allow: []string{"pypi.org", " files.pythonhosted.org "},
			want: client.Policy{Allow: []string{"pypi.org", "files.pythonhosted.org"}}},
		{name: "deny list", deny: []string{"169.254.169.254", "10.0.0.0/8"},
			want: client.Policy{Deny: []string{"169.254.169.254", "10.0.0.0/8"}}},
		{name: "all three, duplicates once", denyAll: true, allow: []string{"*.example.org", "*.example.org"}, deny: []string{"bad.example.org"},
			want: client.Policy{DenyAll: true, Allow: []string{"*.example.org"}, Deny: []string{"bad.example.org"}}},
		{name: "nothing", wantErr: "shard policy clear"},
		{name: "empty allow entry", allow: []string{"a.org", " "}, wantErr: "--allow: an empty entry"},
		{name: "empty deny entry", deny: []string{""}, wantErr: "--deny: an empty entry"},
	} {
		got, err := policyFromFlags(tc.denyAll, tc.allow, tc.deny)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: policyFromFlags = %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

func TestWritePolicy(t *testing.T) {
	for _, tc := range []struct {
		p    client.Policy
		want string
	}{
		{client.Policy{}, "no policy: all egress allowed\n"},
		{client.Policy{DenyAll: true}, "deny-all: yes\nallow: -\ndeny: -\nanything else: denied\n"},
		{client.Policy{Allow: []string{"pypi.org", "10.0.0.0/8"}}, "deny-all: no\nallow: pypi.org 10.0.0.0/8\ndeny: -\nanything else: denied\n"},
		{client.Policy{Deny: []string{"169.254.169.254"}}, "deny-all: no\nallow: -\ndeny: 169.254.169.254\nanything else: allowed\n"},
	} {
		var b strings.Builder
		writePolicy(&b, tc.p)
		if b.String() != tc.want {
			t.Errorf("writePolicy(%+v) =\n%s\nwant\n%s", tc.p, b.String(), tc.want)
		}
	}
}

func TestGrantLine(t *testing.T) {
	for _, tc := range []struct {
		g    client.Grant
		want string
	}{
		{client.Grant{Secret: "API_KEY", Env: "API_KEY"}, "API_KEY as $API_KEY"},
		{client.Grant{Secret: "gh-token", Env: "GH_TOKEN"}, "gh-token as $GH_TOKEN"},
		{client.Grant{Secret: "A"}, "A as $A"},
		{client.Grant{Secret: "tls.key", File: "/etc/app/tls.key"}, "tls.key as the file /etc/app/tls.key"},
	} {
		if got := grantLine(tc.g); got != tc.want {
			t.Errorf("grantLine(%+v) = %q, want %q", tc.g, got, tc.want)
		}
	}
}

// TestPolicySetPrintsName: policy set says which sandbox it changed, as
// policy clear (and stop, rm) do; it printed nothing.
func TestPolicySetPrintsName(t *testing.T) {
	sock := fakeServer(t, map[string]any{"/v0/sandboxes/base/policy": client.Policy{DenyAll: true}})
	for _, args := range [][]string{
		{"policy", "set", "base", "--deny-all"},
		{"policy", "clear", "base"},
	} {
		if out := runCLI(t, append([]string{"--socket", sock}, args...)...); out != "base\n" {
			t.Errorf("shard %s printed %q, want %q", strings.Join(args, " "), out, "base\n")
		}
	}
}

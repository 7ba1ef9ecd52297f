package main

import (
	"strings"
	"testing"
)

func TestEnvFromConflict(t *testing.T) {
	for _, tc := range []struct {
		given []string
		want  string // "" for no error
	}{
		{nil, ""},
		{[]string{"--memory"}, "leave out --memory ("},
		{[]string{"--memory", "IMAGE"}, "leave out --memory and IMAGE ("},
		{[]string{"--memory", "--cpu", "--disk", "--pids", "--env", "--provider", "IMAGE"}, "leave out --memory, --cpu, --disk, --pids, --env, --provider and IMAGE ("},
	} {
		err := envFromConflict("py", tc.given)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("envFromConflict(%q) = %v, want nil", tc.given, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "--env-from py starts from the environment's checkpoint")):
			t.Errorf("envFromConflict(%q) = %v, want an error with %q", tc.given, err, tc.want)
		}
	}
}

func TestSizeFlags(t *testing.T) {
	for _, tc := range []struct {
		memory, cpu, disk string
		want              [3]string
		err               string
	}{
		{want: [3]string{"", "", ""}},
		{memory: "1GiB", cpu: "500m", disk: "2GiB", want: [3]string{`"1GiB"`, `"500m"`, `"2GiB"`}},
		{memory: "lots", err: "--memory: "},
		{disk: "-1", err: "--disk: "},
		{cpu: "many", err: "--cpu: "},
	} {
		m, c, d, err := sizeFlags(tc.memory, tc.cpu, tc.disk)
		if tc.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("sizeFlags(%q, %q, %q) = %v; want an error starting %q", tc.memory, tc.cpu, tc.disk, err, tc.err)
			}
			continue
		}
		if got := [3]string{string(m), string(c), string(d)}; err != nil || got != tc.want {
			t.Errorf("sizeFlags(%q, %q, %q) = %q, %v; want %q", tc.memory, tc.cpu, tc.disk, got, err, tc.want)
		}
	}
}

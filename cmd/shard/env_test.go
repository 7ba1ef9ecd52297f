package main

import (
	"slices"
	"strings"
	"testing"
)

func TestSplitEnvArgs(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		dash        int
		name, image string
		setup       []string
		err         string
	}{
		{args: []string{"py", "python:3.12-slim"}, dash: -1, name: "py", image: "python:3.12-slim"},
		{args: []string{"py", "python:3.12-slim", "pip", "install", "-q", "x"}, dash: 2, name: "py", image: "python:3.12-slim", setup: []string{"pip", "install", "-q", "x"}},
		{args: []string{"py", "python:3.12-slim", "--", "x"}, dash: 2, name: "py", image: "python:3.12-slim", setup: []string{"--", "x"}},
		{args: []string{"py", "python:3.12-slim"}, dash: 2, err: "nothing after --"},
		{args: []string{"py"}, dash: -1, err: "got 1 arguments)"},
		{args: []string{"py", "img", "pip"}, dash: -1, err: "got 3 arguments)"},
		{args: []string{"py", "pip", "install"}, dash: 1, err: "got 1 arguments before --"},
		{args: nil, dash: -1, err: "takes a NAME and an IMAGE"},
	} {
		name, image, setup, err := splitEnvArgs(tc.args, tc.dash)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("splitEnvArgs(%q, %d) = %v; want an error with %q", tc.args, tc.dash, err, tc.err)
			}
			continue
		}
		if err != nil || name != tc.name || image != tc.image || !slices.Equal(setup, tc.setup) {
			t.Errorf("splitEnvArgs(%q, %d) = %q, %q, %q, %v; want %q, %q, %q", tc.args, tc.dash, name, image, setup, err, tc.name, tc.image, tc.setup)
		}
	}
}

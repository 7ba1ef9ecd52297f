// Package envlist handles environments as lists of "KEY=VALUE" strings, the
// form the OCI spec, exec and the API all use.
package envlist

import "strings"

// Merge returns base with each K=V of extra replacing or adding K.
func Merge(base, extra []string) []string {
	out := make([]string, 0, len(base)+len(extra))
	idx := map[string]int{}
	for _, kv := range append(append([]string(nil), base...), extra...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// Value is the value of key (the last, if it repeats); "" when absent.
func Value(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// Has reports whether key is set.
func Has(env []string, key string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}

package project

import (
	"context"
	"errors"
	"testing"
)

// panics reports whether fn panics.
func panics(fn func()) (did bool) {
	defer func() { did = recover() != nil }()
	fn()
	return false
}

// asServer runs the rest of the test as a server does, where a missing
// marker is an error rather than a panic.
func asServer(t *testing.T) {
	t.Helper()
	was := underTest
	underTest = func() bool { return false }
	t.Cleanup(func() { underTest = was })
}

func TestMarkers(t *testing.T) {
	bg := context.Background()
	tests := []struct {
		name      string
		ctx       context.Context
		from      string
		scoped    bool
		of        string
		require   bool // Require returns nil
		visibleA  bool // an object of project "a"
		visibleDf bool // an object of no project (the default's)
	}{
		{"scoped", With(bg, "a"), "a", true, "a", true, true, false},
		{"default", With(bg, Default), Default, true, Default, true, false, true},
		{"unscoped", Unscoped(bg, "a test"), "", false, Default, true, true, true},
		{"scoped again", With(Unscoped(bg, "a test"), "a"), "a", true, "a", true, true, false},
		{"unscoped again", Unscoped(With(bg, "a"), "a test"), "", false, Default, true, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, scoped := From(tt.ctx)
			if p != tt.from || scoped != tt.scoped {
				t.Errorf("From = %q, %v; want %q, %v", p, scoped, tt.from, tt.scoped)
			}
			if got := Of(tt.ctx); got != tt.of {
				t.Errorf("Of = %q, want %q", got, tt.of)
			}
			if err := Require(tt.ctx); (err == nil) != tt.require {
				t.Errorf("Require = %v, want nil: %v", err, tt.require)
			}
			if got := Visible(tt.ctx, "a"); got != tt.visibleA {
				t.Errorf("Visible(a) = %v, want %v", got, tt.visibleA)
			}
			if got := Visible(tt.ctx, ""); got != tt.visibleDf {
				t.Errorf("Visible(\"\") = %v, want %v", got, tt.visibleDf)
			}
		})
	}
}

func TestUnmarkedUnderTest(t *testing.T) {
	bg := context.Background()
	for name, fn := range map[string]func(){
		"With \"\"":       func() { With(bg, "") },
		"With Nowhere":    func() { With(bg, Nowhere) },
		"Unscoped no why": func() { Unscoped(bg, "") },
		"Require":         func() { Require(bg) },
	} {
		if !panics(fn) {
			t.Errorf("%s does not panic under test", name)
		}
	}
}

// TestUnmarkedServer: without the panics of a test, a context with no
// marker (or With "") sees nothing and the store's Require refuses it.
func TestUnmarkedServer(t *testing.T) {
	asServer(t)
	bg := context.Background()
	for name, ctx := range map[string]context.Context{
		"no marker":    bg,
		"With \"\"":    With(bg, ""),
		"With Nowhere": With(bg, Nowhere),
		"Of no marker": With(bg, Of(bg)),
	} {
		t.Run(name, func(t *testing.T) {
			if err := Require(ctx); !errors.Is(err, ErrNoProject) {
				t.Errorf("Require = %v, want ErrNoProject", err)
			}
			if p, scoped := From(ctx); p != Nowhere || !scoped {
				t.Errorf("From = %q, %v; want %q, true", p, scoped, Nowhere)
			}
			if got := Of(ctx); got != Nowhere {
				t.Errorf("Of = %q, want %q", got, Nowhere)
			}
			for _, p := range []string{"", Default, "a", Nowhere} {
				if Visible(ctx, p) {
					t.Errorf("Visible(%q) = true, want false", p)
				}
			}
		})
	}
	if Check(Nowhere) == nil {
		t.Errorf("Check(%q) accepts it: an object could belong to Nowhere", Nowhere)
	}
}

func TestWhy(t *testing.T) {
	bg := context.Background()
	if why, ok := Why(Unscoped(bg, "reconcile")); why != "reconcile" || !ok {
		t.Errorf("Why(Unscoped) = %q, %v; want reconcile, true", why, ok)
	}
	for name, ctx := range map[string]context.Context{"scoped": With(bg, "a"), "unmarked": bg, "scoped again": With(Unscoped(bg, "x"), "a")} {
		if why, ok := Why(ctx); why != "" || ok {
			t.Errorf("Why(%s) = %q, %v; want \"\", false", name, why, ok)
		}
	}
}

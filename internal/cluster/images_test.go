package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/useshards/shard/internal/cluster/etcdtest"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// TestImportsAcrossNodes: an import's name is its project's alone across
// the nodes; another project's key never sees it; a re-import on its node
// moves its digest; only its node releases it; a node that reconciles
// claims its own again and drops what it no longer has.
func TestImportsAcrossNodes(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	a := join(t, etcd.Endpoints(), "a", Stats{})
	b := join(t, etcd.Endpoints(), "b", Stats{})
	bars := project.With(context.Background(), "bars")
	other := project.With(context.Background(), "other")
	const ref, d1, d2 = "localhost/bars/busybox:1", "sha256:1111", "sha256:2222"

	if err := a.ClaimImport(bars, "bars", ref, d1); err != nil {
		t.Fatal(err)
	}
	if err := b.ClaimImport(bars, "bars", ref, d2); errdefs.CodeOf(err) != "name_taken" {
		t.Fatalf("a's import's name claimed on b: %v, want name_taken", err)
	}
	// Another project's name is another name, and sees nothing of bars'.
	if _, err := b.Image(other, ref); errdefs.CodeOf(err) != "image_not_found" {
		t.Fatalf("bars' import seen from project other: %v", err)
	}
	if err := b.ClaimImport(other, "other", ref, d2); err != nil {
		t.Fatalf("the same name in another project: %v", err)
	}
	if p, err := b.Image(bars, ref); err != nil || p.Node != "a" || p.Digest != d1 || p.Project != "bars" || p.Ref != ref {
		t.Fatalf("bars' import seen from b: %+v %v", p, err)
	}
	if p, err := a.Image(other, ref); err != nil || p.Node != "b" || p.Digest != d2 {
		t.Fatalf("other's import seen from a: %+v %v", p, err)
	}
	// Imported again on a: the new digest; its first time kept only for
	// the same digest.
	first, _ := a.Image(bars, ref)
	if err := a.ClaimImport(bars, "bars", ref, d1); err != nil {
		t.Fatal(err)
	}
	if p, _ := b.Image(bars, ref); !p.CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("claimed again with the same digest: created %v, was %v", p.CreatedAt, first.CreatedAt)
	}
	time.Sleep(10 * time.Millisecond)
	if err := a.ClaimImport(bars, "bars", ref, d2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see the new digest", func() bool { p, err := b.Image(bars, ref); return err == nil && p.Digest == d2 })
	// Only its node releases it.
	b.ReleaseImport(bars, "bars", ref)
	if _, err := a.Image(bars, ref); err != nil {
		t.Fatalf("b released a's import: %v", err)
	}
	a.ReleaseImport(bars, "bars", ref)
	waitFor(t, "b to see it gone", func() bool { _, err := b.Image(bars, ref); return errdefs.CodeOf(err) == "image_not_found" })
	if err := b.ClaimImport(bars, "bars", ref, d2); err != nil {
		t.Fatalf("the name once a's import is gone: %v", err)
	}
	b.ReleaseImport(bars, "bars", ref)

	// Reconcile: a's imports as a holds them, none else of a's.
	for _, r := range []string{"localhost/gone:1", "localhost/kept:1"} {
		if err := a.ClaimImport(bars, "bars", r, d1); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.ReconcileImports(context.Background(), []ImagePlacement{
		{Project: "bars", Ref: "localhost/kept:1", Digest: d2},
		{Project: "", Ref: "localhost/mine:1", Digest: d1}, // made before projects: the default project's
		{Project: "other", Ref: ref, Digest: d1},           // b's name: stays b's
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ctx        context.Context
		ref        string
		node, want string
	}{
		{bars, "localhost/gone:1", "", ""},
		{bars, "localhost/kept:1", "a", d2},
		{project.With(context.Background(), project.Default), "localhost/mine:1", "a", d1},
		{other, ref, "b", d2},
	} {
		waitFor(t, "reconciled "+c.ref, func() bool {
			p, err := b.Image(c.ctx, c.ref)
			if c.node == "" {
				return errdefs.CodeOf(err) == "image_not_found"
			}
			return err == nil && p.Node == c.node && p.Digest == c.want
		})
	}
}

// waitFor waits (up to 5 s) for another node's mirror to follow.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 5s", what)
		}
	}
}

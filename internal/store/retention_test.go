package store

import (
	"slices"
	"testing"
	"time"
)

// ResumeUsers names the sandboxes whose session's resume starts from a
// checkpoint: the source while it is its latest, every fork and restore
// made from it while their sessions have none of their own.
func TestResumeUsers(t *testing.T) {
	ctx := own()
	s, _ := newStore(t)
	mk := func(id, name, from string) *Sandbox {
		sb := sample(id, name)
		sb.Session = name
		data := map[string]any{}
		if from != "" {
			data["checkpoint"] = from
		}
		mustCreate(t, s, sb, &EventSpec{Type: "sandbox.created", Data: data})
		return sb
	}
	ck := func(id string, sb *Sandbox, kind string) {
		c := sampleCheckpoint(id, sb, time.Now())
		c.Kind = kind
		if err := s.AddCheckpoint(ctx, c, sb, &EventSpec{Type: "sandbox.checkpoint_created", Data: map[string]any{"checkpoint": id}}); err != nil {
			t.Fatal(err)
		}
	}
	src := mk("src0", "src", "")
	ck("ck1", src, "fork")
	mk("fk10", "fork-a", "ck1")
	fb := mk("fk20", "fork-b", "ck1")
	ck("ck2", fb, "fork") // fork-b's own, later: its resume starts there
	mk("fk30", "fork-of-b", "ck2")
	gone := mk("gone", "gone", "ck1")
	if err := s.DeleteSandbox(ctx, gone.ID, nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ck   string
		want []string
	}{
		{"ck1", []string{"fork-a", "src"}},
		{"ck2", []string{"fork-b", "fork-of-b"}},
		{"none", nil},
	}
	for _, tt := range tests {
		got, err := s.ResumeUsers(ctx, tt.ck)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ResumeUsers(%s) = %v, %v; want %v", tt.ck, got, err, tt.want)
		}
	}
	// A later checkpoint of the source moves its resume off ck1.
	ck("ck3", src, "checkpoint")
	if got, _ := s.ResumeUsers(ctx, "ck1"); !slices.Equal(got, []string{"fork-a"}) {
		t.Errorf("after the source's later checkpoint: ResumeUsers(ck1) = %v, want [fork-a]", got)
	}
}

package sandbox

import "testing"

// TestSetupFailedQuotes: the failed setup command reads back as the argv
// it was, not as its words joined by spaces.
func TestSetupFailedQuotes(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"sh", "-c", "echo oops; exit 2"}, "environment bad: setup command sh -c 'echo oops; exit 2' exited 2: oops"},
		{[]string{"false"}, "environment bad: setup command false exited 2: oops"},
		{[]string{"echo", "it's", ""}, `environment bad: setup command echo 'it'\''s' '' exited 2: oops`},
	} {
		err := setupFailed("bad", tc.argv, 2, "oops\n")
		if got := err.Error(); got != tc.want {
			t.Errorf("setupFailed(%q) = %q, want %q", tc.argv, got, tc.want)
		}
	}
}

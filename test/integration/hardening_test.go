package integration

import (
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// TestSandboxHardening: a sandbox's commands run as a container engine's
// default would run them: under Docker's default seccomp profile and with
// no new privileges (runc; a gVisor sandbox's syscalls reach the Sentry,
// not the host kernel), with Docker's default capabilities and no more, and
// with the host's sensitive /proc and /sys files masked or read-only. And
// an ordinary workload still works under all of it.
func TestSandboxHardening(t *testing.T) {
	e := need(t)
	// Docker's default bounding set; runsc also drops CAP_NET_RAW unless
	// it is run with --net-raw.
	wantCapBnd := map[string]string{"runc": "00000000a80425fb", "gvisor": "00000000a80405fb"}
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov})
			status := func(user, key string) string {
				t.Helper()
				res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{User: user, Argv: []string{"grep", key + ":", "/proc/self/status"}})
				if err != nil {
					t.Fatal(err)
				}
				_, v, _ := strings.Cut(string(res.Stdout), ":")
				return strings.TrimSpace(v)
			}
			// runc only: under gVisor the Sentry is the syscall boundary,
			// and runsc restores only a checkpoint whose spec is unchanged
			// (oci.ConfineHostKernel).
			if prov == "runc" {
				if got := status("", "Seccomp"); got != "2" {
					t.Errorf("Seccomp: %q, want 2 (a filter)", got)
				}
				if got := status("", "NoNewPrivs"); got != "1" {
					t.Errorf("NoNewPrivs: %q, want 1", got)
				}
			}
			for _, set := range []string{"CapBnd", "CapPrm", "CapEff"} {
				if got := status("", set); got != wantCapBnd[prov] {
					t.Errorf("%s of a root command: %q, want %s (Docker's default set)", set, got, wantCapBnd[prov])
				}
			}
			for _, set := range []string{"CapInh", "CapAmb"} {
				if got := status("", set); got != "0000000000000000" {
					t.Errorf("%s of a root command: %q, want none", set, got)
				}
			}
			for _, set := range []string{"CapPrm", "CapEff"} {
				if got := status("nobody", set); got != "0000000000000000" {
					t.Errorf("%s of a command as nobody: %q, want none", set, got)
				}
			}
			// A probe must fail (exit non-zero, or print nothing).
			for _, probe := range []struct{ what, sh string }{
				// Docker's profile lets only CAP_SYS_ADMIN unshare
				// namespaces; a user namespace is how an unprivileged
				// process reaches much of the kernel's attack surface.
				{"a user namespace", "unshare -U -r true"},
				{"/proc/kcore", "[ $(head -c 16 /proc/kcore | wc -c) -gt 0 ]"},
				{"/proc/keys", "grep -q . /proc/keys"},
				{"/proc/timer_list", "grep -q . /proc/timer_list"},
				{"/sys/firmware", "ls -A /sys/firmware | grep -q ."},
				// Opening for writing is enough: it writes nothing (no
				// sysrq is sent if the test ever fails).
				{"writing /proc/sysrq-trigger", ": > /proc/sysrq-trigger"},
				{"writing /proc/sys", "echo 1 > /proc/sys/kernel/sysrq"},
				{"a mount", "mkdir -p /m && mount -t tmpfs none /m"},
			} {
				if prov == "gvisor" && (probe.what == "a user namespace" || strings.HasPrefix(probe.what, "writing")) {
					// gVisor's own user namespaces, and its own /proc
					// (sysrq-trigger there reaches no kernel), in the Sentry.
					continue
				}
				res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{Argv: []string{"sh", "-c", probe.sh}})
				if err != nil {
					t.Fatal(err)
				}
				if res.ExitCode == 0 {
					t.Errorf("%s: `%s` succeeded", probe.what, probe.sh)
				}
			}
			// What an ordinary workload (a package manager, a service
			// dropping root) does still works.
			execOK(t, sb.ID, "sh", "-c", "touch /f && chown 65534:65534 /f && chmod 4755 /f && chgrp 0 /f")
			if got := execOK(t, sb.ID, "su", "-s", "/bin/sh", "nobody", "-c", "id -u"); got != "65534\n" {
				t.Errorf("su nobody: id -u = %q", got)
			}
			res, err := e.c.Exec(ctxT(t), sb.ID, client.ExecRequest{User: "nobody", Argv: []string{"sh", "-c", "id -u; touch /tmp/mine && ls -ln /tmp/mine"}})
			if err != nil || res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), "65534\n") {
				t.Errorf("exec as nobody: %+v, %v", res, err)
			}
		})
	}
}

// TestAgentNotTraceable: a sandbox's commands, root as they are, cannot
// read the agent's memory or its first environment (its token) through
// /proc/1, nor so forge what it reports: the agent is not dumpable, and no
// sandbox has CAP_SYS_PTRACE. On runc both were readable.
func TestAgentNotTraceable(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov})
			out := execOK(t, sb.ID, "sh", "-c", `tr '\0' '\n' </proc/1/environ 2>/dev/null | grep -c SHARD_AGENT_TOKEN; `+
				`dd if=/proc/1/mem bs=1 count=4 skip=$((0x$(head -1 /proc/1/maps 2>/dev/null | cut -d- -f1))) 2>/dev/null | od -An -c; `+
				`cat /proc/self/status | grep -c '^Name'; true`)
			if strings.Contains(out, "E   L   F") || strings.HasPrefix(out, "1\n") {
				t.Errorf("a command reads the agent's environ or memory:\n%s", out)
			}
			if !strings.HasSuffix(strings.TrimSpace(out), "1") {
				t.Errorf("the command's own /proc/self is not readable (its execs must stay dumpable):\n%s", out)
			}
		})
	}
}

package aws

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/arbiter-serve/arbiter/replicas"
)

// maxUserData is EC2's limit on user data before base64 (RunInstances, UserData).
const maxUserData = 16 << 10

// Variables a replica's script may read. ARBITER_HOST and ARBITER_DIR keep a value the
// environment already gives them: on a VM none is set (bind every address, work in
// /opt/arbiter); the test double, which runs many instances on one host, gives each its
// loopback address and folder.
const (
	envHost = "ARBITER_HOST"
	envDir  = "ARBITER_DIR"
)

// userData is the cloud-init script that turns a fresh instance into a replica: the
// spec's envs, then its setup and run, as root in ARBITER_DIR. cloud-init runs a user
// data script that starts with #! once, at first boot
// (https://cloudinit.readthedocs.io/en/latest/explanation/format.html). The replica runs
// as a transient systemd unit so the script (and cloud-init's final stage) ends; where
// systemd is not running it runs in the script's place.
func userData(ls replicas.LaunchSpec, port int) (string, error) {
	tag, err := delimiter(ls.Setup + ls.Run)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "#!/bin/bash\n# Arbiter replica %s of service %s, version %d.\nset -euo pipefail\n", ls.ReplicaID, ls.Service, ls.Version)
	export := func(k, v string) { fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(v)) }
	export("PORT", strconv.Itoa(port))
	export("ARBITER_REPLICA_ID", ls.ReplicaID)
	export("ARBITER_SERVICE", ls.Service)
	export("ARBITER_PROVIDER", ProviderName)
	// SkyPilot's name, which SkyServe run commands use (--tensor-parallel-size).
	export("SKYPILOT_NUM_GPUS_PER_NODE", strconv.Itoa(ls.AcceleratorCount))
	keys := slices.Sorted(maps.Keys(ls.Envs))
	for _, k := range keys {
		export(k, ls.Envs[k])
	}
	fmt.Fprintf(&b, "export %s=\"${%s:-0.0.0.0}\"\nexport %s=\"${%s:-/opt/arbiter}\"\n", envHost, envHost, envDir, envDir)
	fmt.Fprintf(&b, "mkdir -p \"$%s\"\ncd \"$%s\"\n", envDir, envDir)
	fmt.Fprintf(&b, "cat > setup.sh <<'%s'\n%s\n%s\n", tag, ls.Setup, tag)
	fmt.Fprintf(&b, "cat > run.sh <<'%s'\n%s\n%s\n", tag, ls.Run, tag)
	b.WriteString("bash setup.sh > setup.log 2>&1\n")
	b.WriteString("if [ -d /run/systemd/system ] && command -v systemd-run > /dev/null; then\n")
	b.WriteString("  exec systemd-run --unit=arbiter-replica --collect --property=WorkingDirectory=\"$" + envDir + "\" " +
		"--setenv=PORT --setenv=" + envHost + " --setenv=ARBITER_REPLICA_ID --setenv=ARBITER_SERVICE --setenv=SKYPILOT_NUM_GPUS_PER_NODE" + setenvs(keys) +
		" /bin/bash -c 'exec bash run.sh > run.log 2>&1'\nfi\n")
	b.WriteString("exec bash run.sh > run.log 2>&1\n")
	if b.Len() > maxUserData {
		return "", fmt.Errorf("aws: the replica's script is %d bytes with the spec's setup, run and envs; EC2 takes at most %d: move long scripts into the image or fetch them in setup", b.Len(), maxUserData)
	}
	return b.String(), nil
}

func setenvs(keys []string) string {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(" --setenv=" + k)
	}
	return b.String()
}

// delimiter is a here-document end marker that no line of the text is.
func delimiter(text string) (string, error) {
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", fmt.Errorf("aws: user data: %w", err)
	}
	tag := "ARBITER_" + strings.ToUpper(hex.EncodeToString(r[:]))
	if strings.Contains(text, tag) {
		return "", fmt.Errorf("aws: user data: the spec's script contains %s", tag)
	}
	return tag, nil
}

// shellQuote quotes s for bash as one word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

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
	"github.com/arbiter-serve/arbiter/spec"
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
	// envIMDS is where the instance metadata service answers: unset on EC2
	// (169.254.169.254); the test double serves each instance's own.
	envIMDS = "ARBITER_IMDS"
)

// userData is the cloud-init script that turns a fresh instance into a replica: the
// spec's envs, then its setup and run, as root in ARBITER_DIR. cloud-init runs a user
// data script that starts with #! once, at first boot
// (https://cloudinit.readthedocs.io/en/latest/explanation/format.html). The replica runs
// as a transient systemd unit so the script (and cloud-init's final stage) ends; where
// systemd is not running it runs in the script's place. With a workdir (wd), the script
// first fetches it into ~/sky_workdir, as SkyPilot places it, and setup and run run there.
func userData(ls replicas.LaunchSpec, port, rank int, wd *workdirFetch) (string, error) {
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
	// cloud-init may run the script without HOME; root's is /root.
	b.WriteString("export HOME=\"${HOME:-/root}\"\n")
	nodeEnvs, awaitIPs := "", ""
	if n := ls.Nodes(); n > 1 {
		// SkyPilot's node variables, which a multi-node run: script reads (rank 0 is the
		// head the router talks to). Every node's IP is known only once all run: the
		// provider then tags each instance with the list (tagNodeIPs), and the script reads
		// it from the instance metadata (IMDSv2, tags enabled at launch) after its setup,
		// before its run, as a pod of a kubernetes group does.
		export("SKYPILOT_NODE_RANK", strconv.Itoa(rank))
		export("SKYPILOT_NUM_NODES", strconv.Itoa(n))
		awaitIPs = fmt.Sprintf("imds=\"${%s:-http://169.254.169.254}\"\n", envIMDS) +
			fmt.Sprintf("echo \"arbiter: node %d of %d waits for every node's IP\" >&2\n", rank, n) +
			`until ips="$(curl -sf -H "X-aws-ec2-metadata-token: $(curl -sf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "$imds/latest/api/token")" "$imds/latest/meta-data/tags/instance/` + tagNodeIPs + `")" && [ -n "$ips" ]; do sleep 1; done` + "\n" +
			"export SKYPILOT_NODE_IPS=\"$(printf '%s\\n' $ips)\"\n"
		nodeEnvs = " --setenv=SKYPILOT_NODE_RANK --setenv=SKYPILOT_NUM_NODES --setenv=SKYPILOT_NODE_IPS"
	}
	fmt.Fprintf(&b, "mkdir -p \"$%s\"\ncd \"$%s\"\n", envDir, envDir)
	b.WriteString(s3Mounts(ls.FileMounts))
	fmt.Fprintf(&b, "cat > setup.sh <<'%s'\n%s\n%s\n", tag, ls.Setup, tag)
	fmt.Fprintf(&b, "cat > run.sh <<'%s'\n%s\n%s\n", tag, ls.Run, tag)
	if wd != nil {
		b.WriteString(fetchWorkdir(wd))
	}
	// Setup and run run in the workdir, if any, else in ARBITER_DIR; their scripts and
	// logs stay in ARBITER_DIR.
	fmt.Fprintf(&b, "bash \"$%s/setup.sh\" > \"$%[1]s/setup.log\" 2>&1\n", envDir)
	b.WriteString(awaitIPs)
	b.WriteString("if [ -d /run/systemd/system ] && command -v systemd-run > /dev/null; then\n")
	b.WriteString("  exec systemd-run --unit=arbiter-replica --collect --property=WorkingDirectory=\"$PWD\" " +
		"--setenv=PORT --setenv=" + envHost + " --setenv=ARBITER_REPLICA_ID --setenv=ARBITER_SERVICE --setenv=SKYPILOT_NUM_GPUS_PER_NODE" + nodeEnvs + setenvs(keys) +
		" /bin/bash -c 'exec bash \"$0\" > \"$1\" 2>&1' \"$" + envDir + "/run.sh\" \"$" + envDir + "/run.log\"\nfi\n")
	fmt.Fprintf(&b, "exec bash \"$%s/run.sh\" > \"$%[1]s/run.log\" 2>&1\n", envDir)
	if b.Len() > maxUserData {
		return "", fmt.Errorf("aws: the replica's script is %d bytes with the spec's setup, run and envs; EC2 takes at most %d: move long scripts into the image or fetch them in setup", b.Len(), maxUserData)
	}
	return b.String(), nil
}

// fetchWorkdir is the script that puts the staged workdir in ~/sky_workdir (emptied
// first, as a fresh VM's is) and moves there: curl from the presigned URL, retried, then
// the archive's SHA-256 checked before it is unpacked. A failure stops the script (set
// -e), and the user-data log says why.
func fetchWorkdir(wd *workdirFetch) string {
	var b strings.Builder
	fmt.Fprintf(&b, "archive=\"$%s/workdir.tar.gz\"\n", envDir)
	b.WriteString("echo 'arbiter: fetching the workdir into ~/sky_workdir' >&2\n")
	fmt.Fprintf(&b, "curl -fsS --retry 8 --retry-connrefused --retry-delay 2 --max-time 1800 -o \"$archive\" %s\n", shellQuote(wd.url))
	fmt.Fprintf(&b, "if [ \"$(sha256sum \"$archive\" | cut -d' ' -f1)\" != %s ]; then echo 'arbiter: the workdir fetched is not the one staged (SHA-256 differs)' >&2; exit 1; fi\n", wd.sha256)
	b.WriteString("rm -rf \"$HOME/sky_workdir\"\nmkdir -p \"$HOME/sky_workdir\"\n")
	b.WriteString("tar -xzf \"$archive\" -C \"$HOME/sky_workdir\" --no-same-owner\nrm -f \"$archive\"\n")
	b.WriteString("cd \"$HOME/sky_workdir\"\n")
	return b.String()
}

// s3Mounts is the script that puts file_mounts' S3 buckets (spec validation refuses any
// other source on aws) where the run: script reads them, with AWS's own tools, before
// setup: MOUNT and MOUNT_CACHED with Mountpoint for Amazon S3 (mount-s3 BUCKET DIR
// [--prefix P/] [--cache DIR], https://docs.aws.amazon.com/AmazonS3/latest/userguide/mountpoint-usage.html),
// COPY with aws s3 sync. Both must be in the AMI, and the instance profile must reach the
// bucket; a failure stops the script (set -e), so the replica never becomes ready and
// its user-data log says why. A relative path is under the home directory, as SkyPilot
// places file mounts.
func s3Mounts(mounts []spec.FileMount) string {
	var b strings.Builder
	for i, m := range mounts {
		dir := m.Path
		switch {
		case strings.HasPrefix(dir, "~/"):
			dir = "$HOME/" + shellQuote(strings.TrimPrefix(dir, "~/"))
		case !strings.HasPrefix(dir, "/"):
			dir = "$HOME/" + shellQuote(dir)
		default:
			dir = shellQuote(dir)
		}
		bucket, prefix, _ := strings.Cut(strings.TrimPrefix(m.Source, "s3://"), "/")
		fmt.Fprintf(&b, "mkdir -p %s\n", dir)
		switch m.Mode {
		case "COPY":
			fmt.Fprintf(&b, "aws s3 sync --only-show-errors %s %s\n", shellQuote(m.Source), dir)
		default:
			args := shellQuote(bucket) + " " + dir
			if prefix = strings.TrimSuffix(prefix, "/"); prefix != "" {
				args += " --prefix " + shellQuote(prefix+"/")
			}
			if m.Mode == "MOUNT_CACHED" {
				cache := fmt.Sprintf("/var/cache/arbiter-s3/%d", i)
				fmt.Fprintf(&b, "mkdir -p %s\n", cache)
				args += " --cache " + cache
			}
			fmt.Fprintf(&b, "mount-s3 %s\n", args)
		}
	}
	return b.String()
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

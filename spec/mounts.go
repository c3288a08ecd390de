package spec

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// FileMount is one entry of file_mounts (SkyPilot's storage mounts): what a replica finds
// at Path. Which sources a provider can honour is checked against arbiter.providers when
// the file is parsed (checkMounts), so that what validates runs.
type FileMount struct {
	// Path is where the run: script reads it, as written: absolute, ~/…, or relative to
	// the home directory (SkyPilot's rule).
	Path string
	// Source is a local path as written (~ allowed), or a bucket URL (s3://bucket/prefix,
	// gs://…) with the bucket named by the block form's name and store filled in.
	Source string
	// Store is the bucket's store (s3, gcs, r2, azure, ibm, oci, nebius); "" for a local
	// source.
	Store string
	// Mode is how a bucket reaches the replica: MOUNT, COPY or MOUNT_CACHED (SkyPilot's
	// default: COPY for the short form, MOUNT for the block); "" for a local source, which
	// is made available as it is.
	Mode string

	// bucket is an existing bucket named without store ({name: NAME}); SkyPilot looks it
	// up in the store of the cloud the replica runs on, so checkMounts resolves it against
	// arbiter.providers (Source and Store filled in, bucket cleared) or refuses it there.
	bucket string
}

// Local reports whether the source is a path on the machine serve up runs on.
func (m FileMount) Local() bool { return m.Store == "" && m.bucket == "" }

// Volume is one entry of volumes: a volume by name (on Kubernetes, a
// PersistentVolumeClaim in the provider's namespace) mounted at Path.
type Volume struct {
	Path, Name string
}

// TaskConfig is what Arbiter honours of SkyPilot's per-task config overrides (config:).
// Keys it cannot honour are refused where the provider they are about is in use, and a
// warning (Service.Warnings) where none is.
type TaskConfig struct {
	// KubernetesLabels and KubernetesAnnotations are config.kubernetes.custom_metadata:
	// set on every pod the kubernetes provider creates.
	KubernetesLabels, KubernetesAnnotations map[string]string
}

// Warnings are what Parse accepted but has no effect where the service runs (config keys
// for a platform it does not use), each at its place in the file.
func (s *Service) Warnings() ErrorList { return s.warnings }

// bucketSchemes maps a bucket URL's scheme to SkyPilot's store name.
var bucketSchemes = []struct{ prefix, store string }{
	{"s3://", "s3"}, {"gs://", "gcs"}, {"r2://", "r2"}, {"cos://", "ibm"}, {"oci://", "oci"},
	{"nebius://", "nebius"}, {"https://", "azure"},
}

// storeSchemes is the other way, for the block form's store key.
var storeSchemes = map[string]string{"s3": "s3://", "gcs": "gs://", "r2": "r2://", "ibm": "cos://", "oci": "oci://", "nebius": "nebius://"}

var mountModes = []string{"mount", "copy", "mount_cached"}

// fileMounts reads file_mounts: "PATH: SOURCE" or "PATH: {name, source, store, mode,
// persistent}". As SkyPilot does when it reads the file, $VAR and ${VAR} naming one of
// envs (not secrets) are filled in, in paths, sources and bucket names.
func (d *decoder) fileMounts(n *yaml.Node, envs map[string]string) []FileMount {
	ps, _ := d.pairs("file_mounts", n, "a mapping of replica paths to sources, e.g. /data: ~/data or /data: s3://bucket")
	var out []FileMount
	for _, p := range ps {
		p.name = substitute(p.name, envs)
		path := "file_mounts." + p.name
		if strings.TrimSpace(p.name) == "" {
			d.errorf(p.key, "file_mounts: an empty path; write where the run: script reads the files, e.g. /data")
			continue
		}
		m := FileMount{Path: p.name}
		switch {
		case isNull(p.val):
			d.errorf(p.val, "%s: no source; give a local path or a bucket URL (s3://bucket)", path)
			continue
		case p.val.Kind == yaml.ScalarNode:
			src, ok := d.str(path, p.val)
			if !ok {
				continue
			}
			src = substitute(src, envs)
			if strings.TrimSpace(src) == "" {
				d.errorf(p.val, "%s: an empty source; give a local path or a bucket URL (s3://bucket)", path)
				continue
			}
			m.Source = src
			if store, ok := d.bucketStore(path, p.val, src); !ok {
				continue
			} else if store != "" {
				m.Store, m.Mode = store, "COPY" // SkyPilot copies a bucket given as a URL
			}
		default:
			b := d.block(path, p.key, p.val, []string{"name", "source", "store", "mode", "persistent"})
			if b == nil {
				continue
			}
			var name, store, mode string
			b.str("name", &name)
			b.str("source", &m.Source)
			b.enum("store", []string{"s3", "gcs", "r2", "azure", "ibm", "oci", "nebius"}, &store)
			b.enum("mode", mountModes, &mode)
			var persistent bool
			b.boolean("persistent", &persistent)
			name, m.Source = substitute(name, envs), substitute(m.Source, envs)
			if b.get("source") != nil && b.get("source").Kind != yaml.ScalarNode {
				continue // a list of local sources: reported by str above
			}
			m.Mode = cmpOr(strings.ToUpper(mode), "MOUNT")
			switch {
			case m.Source == "" && name == "":
				d.errorf(p.key, "%s: give source (a bucket URL such as s3://bucket) or name (an existing bucket) with store", path)
				continue
			case m.Source == "" && store == "":
				// An existing bucket in the store of the cloud the replica runs on
				// (SkyPilot's rule): resolved by checkMounts, which knows the providers.
				m.bucket = name
			case m.Source == "":
				if storeSchemes[store] == "" {
					d.errorf(b.get("store"), "%s.store: %s buckets are named by URL; give source: https://ACCOUNT.blob.core.windows.net/%s", path, store, name)
					continue
				}
				m.Source, m.Store = storeSchemes[store]+name, store
			default:
				st, ok := d.bucketStore(path+".source", b.get("source"), m.Source)
				if !ok {
					continue
				}
				if st == "" {
					// SkyPilot uploads the folder into a new bucket named name; Arbiter
					// creates no buckets.
					d.errorf(b.get("source"), "%s: a local source in the block form asks for a bucket to be created and filled from it, which Arbiter does not do; upload it yourself and give source: s3://BUCKET, or write %s: %s to use the folder as it is", path, p.name, m.Source)
					continue
				}
				if store != "" && store != st {
					d.errorf(b.get("store"), "%s.store: %s, but source %s is a %s bucket", path, store, quote(m.Source), st)
					continue
				}
				m.Store = st
			}
		}
		if !m.Local() && strings.HasPrefix(m.Path, "~") {
			// SkyPilot refuses it too: a mount point must be absolute or relative to ~.
			d.errorf(p.key, "%s: a bucket is mounted at an absolute path or one relative to the home directory; write %s", path, strings.TrimPrefix(strings.TrimPrefix(m.Path, "~"), "/"))
			continue
		}
		d.mountAt = append(d.mountAt, p.key)
		out = append(out, m)
	}
	return out
}

// bucketStore says which store a source URL names, "" for a local path; false after
// reporting a scheme no store uses.
func (d *decoder) bucketStore(path string, at *yaml.Node, src string) (string, bool) {
	for _, s := range bucketSchemes {
		if strings.HasPrefix(src, s.prefix) {
			if s.store == "azure" && !strings.Contains(src, ".blob.core.windows.net/") {
				break
			}
			if len(src) == len(s.prefix) {
				d.errorf(at, "%s: %s names no bucket; write %sBUCKET", path, quote(src), s.prefix)
				return "", false
			}
			return s.store, true
		}
	}
	if i := strings.Index(src, "://"); i > 0 {
		d.errorf(at, "%s: %s is not a bucket URL SkyPilot knows; write s3://, gs://, r2://, cos://, oci://, nebius:// or https://ACCOUNT.blob.core.windows.net/CONTAINER, or a local path", path, quote(src))
		return "", false
	}
	return "", true
}

// volumes reads volumes: "PATH: NAME".
func (d *decoder) volumes(n *yaml.Node) []Volume {
	ps, _ := d.pairs("volumes", n, "a mapping of replica paths to volume names, e.g. /mnt/data: my-pvc")
	var out []Volume
	for _, p := range ps {
		path := "volumes." + p.name
		if !strings.HasPrefix(p.name, "/") {
			d.errorf(p.key, "%s: a volume is mounted at an absolute path; write /%s", path, strings.TrimPrefix(strings.TrimPrefix(p.name, "~"), "/"))
			continue
		}
		if p.val.Kind != yaml.ScalarNode || isNull(p.val) {
			// SkyPilot's block form (an ephemeral volume made for the cluster) needs a
			// storage class Arbiter does not choose for the user.
			d.errorf(p.val, "%s: want the name of an existing volume (on Kubernetes a PersistentVolumeClaim), got %s; create it first (kubectl apply, or sky volumes apply with use_existing) and write %s: NAME", path, describe(p.val), p.name)
			continue
		}
		name, ok := d.str(path, p.val)
		if !ok {
			continue
		}
		if !dns1123.MatchString(name) {
			d.errorf(p.val, "%s: %s is not a volume name; a PersistentVolumeClaim's name is lower-case letters, digits, - and ., starting and ending with a letter or digit", path, quote(name))
			continue
		}
		d.volumeAt = append(d.volumeAt, p.key)
		out = append(out, Volume{Path: p.name, Name: name})
	}
	return out
}

// configKey is one key SkyPilot lets a task override (constants.OVERRIDEABLE_CONFIG_KEYS_IN_TASK
// in SkyPilot's sky/skylet/constants.py), with what Arbiter does with it.
type configKey struct {
	path string
	// on reports whether a provider the key is about is in use; nil: none of Arbiter's.
	on func(provider string) bool
	// why, when not empty, is why the key is refused while its provider is in use.
	why string
}

var configKeys = []configKey{
	{"docker.run_options", nil, ""},
	{"nvidia_gpus.disable_ecc", isAWS, "the aws provider boots the AMI as it is and does not change GPU ECC settings; set them in the AMI"},
	{"ssh.pod_config", nil, ""}, {"ssh.custom_metadata", nil, ""}, {"ssh.provision_timeout", nil, ""},
	{"kubernetes.custom_metadata", IsKubernetes, ""},
	{"kubernetes.pod_config", IsKubernetes, "the kubernetes provider does not merge a pod_config into its pods; set node selectors and tolerations in the provider's node pools (serve daemon --kube-*), labels and annotations with config.kubernetes.custom_metadata, and volumes with volumes:"},
	{"kubernetes.provision_timeout", IsKubernetes, "Arbiter replaces a replica not ready in time by its own rule; write arbiter.readiness.ready_budget_seconds instead"},
	{"kubernetes.dws", IsKubernetes, "the kubernetes provider does not queue pods through Dynamic Workload Scheduler"},
	{"kubernetes.kueue", IsKubernetes, "the kubernetes provider does not queue pods through Kueue"},
	{"kubernetes.remote_identity", IsKubernetes, "the kubernetes provider's pods run as the namespace's default service account"},
	{"gcp.managed_instance_group", nil, ""}, {"gcp.enable_gvnic", nil, ""}, {"gcp.enable_gpu_direct", nil, ""}, {"gcp.placement_policy", nil, ""},
	{"vast.datacenter_only", nil, ""}, {"vast.create_instance_kwargs", nil, ""},
	{"active_workspace", nil, ""},
}

// dns1123 is a Kubernetes object name (RFC 1123 subdomain), which a PVC's name is.
var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func isAWS(p string) bool { return p == "aws" }

// awsMaxNodes is the aws provider's limit on num_nodes (replicas/aws.MaxNodes).
const awsMaxNodes = 16

// config reads SkyPilot's config: block; what each key means here is settled in
// checkMounts, which knows the providers.
func (d *decoder) config(n *yaml.Node) TaskConfig {
	var top []string
	for _, k := range configKeys {
		if h, _, _ := strings.Cut(k.path, "."); !slices.Contains(top, h) {
			top = append(top, h)
		}
	}
	var tc TaskConfig
	b := d.block("config", nil, n, top)
	if b == nil {
		return tc
	}
	for _, h := range top {
		v := b.get(h)
		if v == nil {
			continue
		}
		var subs []string
		for _, k := range configKeys {
			if p, s, ok := strings.Cut(k.path, "."); ok && p == h {
				subs = append(subs, s)
			}
		}
		if subs == nil { // active_workspace: a name
			d.configAt[h] = b.key(h)
			continue
		}
		sb := d.block("config."+h, b.key(h), v, subs)
		for _, s := range subs {
			if sb.key(s) != nil {
				d.configAt[h+"."+s] = sb.key(s)
			}
		}
		if h != "kubernetes" || sb.get("custom_metadata") == nil {
			continue
		}
		cm := d.block("config.kubernetes.custom_metadata", sb.key("custom_metadata"), sb.get("custom_metadata"), []string{"labels", "annotations"})
		if v := cm.get("labels"); v != nil {
			tc.KubernetesLabels = d.stringMap("config.kubernetes.custom_metadata.labels", v)
		}
		if v := cm.get("annotations"); v != nil {
			tc.KubernetesAnnotations = d.stringMap("config.kubernetes.custom_metadata.annotations", v)
		}
	}
	return tc
}

// checkMounts holds file_mounts, volumes, config and num_nodes to what the service's
// providers can do: what one of them cannot is refused here, naming the key and the
// provider, rather than dropped or found out at launch.
func (d *decoder) checkMounts(s *Service) {
	providers := s.Arbiter.Providers
	uses := func(f func(string) bool) string {
		for _, p := range providers {
			if f(p) {
				return p
			}
		}
		return ""
	}
	localish := func(p string) bool { return p == "local" || p == "sim" }
	for i := range s.FileMounts {
		m := &s.FileMounts[i]
		at, path := d.mountAt[i], "file_mounts."+m.Path
		if m.bucket != "" {
			// Named without store: SkyPilot looks the bucket up in the store of the cloud
			// the replica runs on. Of Arbiter's providers only aws mounts buckets (S3).
			if uses(isAWS) != "" {
				m.Source, m.Store, m.bucket = "s3://"+m.bucket, "s3", ""
			} else if p := uses(func(string) bool { return true }); p != "" {
				d.errorf(at, "%s: bucket %s is named without store, to be found in the store of the cloud the replica runs on, and the %s provider mounts no buckets; run the service on the aws provider (arbiter: {providers: [aws]}, the bucket in S3), or sync the bucket to a folder on this machine and write %s: DIR", path, quote(m.bucket), p, m.Path)
				continue
			}
		}
		if m.Local() {
			if p := uses(func(p string) bool { return !localish(p) }); p != "" {
				d.errorf(at, "%s: the %s provider cannot copy a folder from this machine into its replicas; put it in a bucket and mount that%s, build it into the image, or fetch it in setup", path, p, awsHint(p))
			}
			continue
		}
		if p := uses(localish); p != "" {
			d.errorf(at, "%s: the %s provider does not mount buckets; sync it to a folder on this machine (aws s3 sync %s DIR) and write %s: DIR", path, p, m.Source, m.Path)
		}
		if p := uses(func(p string) bool { return IsKubernetes(p) || p == "runpod" }); p != "" {
			d.errorf(at, "%s: the %s provider does not mount buckets into its replicas (it runs no FUSE mounts); copy the data into a volume (volumes: {PATH: PVC}) or fetch it in setup", path, p)
		}
		if m.Store != "s3" && uses(isAWS) != "" {
			d.errorf(at, "%s: the aws provider mounts S3 buckets only (with mount-s3 or aws s3 sync on the instance), not %s; copy the data into an S3 bucket", path, m.Store)
		}
	}
	for i, v := range s.Volumes {
		if p := uses(func(p string) bool { return !IsKubernetes(p) }); p != "" {
			d.errorf(d.volumeAt[i], "volumes.%s: the %s provider has no volumes (SkyPilot's volumes are Kubernetes PersistentVolumeClaims); use file_mounts with a folder or a bucket, or run the service on kubernetes", v.Path, p)
		}
	}
	for _, k := range configKeys {
		at := d.configAt[k.path]
		if at == nil {
			continue
		}
		if k.on != nil {
			if p := uses(k.on); p != "" {
				if k.why != "" {
					d.errorf(at, "config.%s: %s", k.path, k.why)
				}
				continue
			}
		}
		what := "Arbiter has no provider it is about"
		if k.on != nil {
			what = "no provider in arbiter.providers (" + strings.Join(providers, ", ") + ") is one it is about"
		}
		d.warnf(at, "config.%s: has no effect: %s", k.path, what)
	}
	if s.NumNodes > 1 {
		// The local provider (and sim, which runs its replicas through it) launches a
		// replica's nodes as a process group, kubernetes as a pod group (or a
		// LeaderWorkerSet), aws as instances in one cluster placement group; runpod
		// launches one pod per replica, with no way to place several together.
		if p := uses(func(p string) bool { return !localish(p) && !IsKubernetes(p) && !isAWS(p) }); p != "" {
			d.errorAt("num_nodes", "num_nodes: %d: the %s provider launches a replica on one machine; run multi-node replicas on the local, kubernetes or aws provider", s.NumNodes, p)
		}
		if s.NumNodes > awsMaxNodes && uses(isAWS) != "" {
			d.errorAt("num_nodes", "num_nodes: %d: the aws provider launches at most %d nodes a replica (every node's IP reaches the nodes in one EC2 tag, at most 256 characters)", s.NumNodes, awsMaxNodes)
		}
	}
}

func awsHint(p string) string {
	if p == "aws" {
		return " (an S3 bucket: /path: s3://bucket)"
	}
	return ""
}

// warnf records a warning at n.
func (d *decoder) warnf(n *yaml.Node, format string, args ...any) {
	e := &Error{File: d.file, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	d.warns = append(d.warns, e)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

package aws

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/pricing"
)

// ProviderName is the provider's name in specs (arbiter.providers: [aws]).
const ProviderName = "aws"

// DefaultImageName finds the AMI replicas boot when neither the spec (resources.image_id:
// ami-…) nor the account's image names one: AWS's deep learning base image with NVIDIA's
// driver and CUDA, the newest that matches (DescribeImages, owner amazon).
const DefaultImageName = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"

// DefaultPort is the replica port when the spec names none (service.ports).
const DefaultPort = 8080

// Account is the providers file's aws section: one AWS account, in one or more regions.
// Credentials are never in it: the SDK's default chain finds them (environment, the
// shared config and credentials files and their profile, an instance or pod role).
type Account struct {
	// Profile is the shared config profile to use (default: AWS_PROFILE, else default).
	Profile string `yaml:"profile"`
	// Regions the provider quotes and launches in (default: the profile's region).
	Regions []string `yaml:"regions"`
	// Endpoint replaces EC2's regional endpoint (a VPC endpoint, or a local fake in tests).
	Endpoint string `yaml:"endpoint"`
	// Image is the AMI replicas boot when the spec names none: an id (ami-…) or a name
	// pattern DescribeImages matches, the newest match winning (default DefaultImageName).
	Image string `yaml:"image"`
	// ImageOwners are the owners an image name is looked up among (default: amazon).
	ImageOwners []string `yaml:"image_owners"`
	// Subnets maps a zone (AZ id, e.g. use1-az1, or name) to the subnet replicas there
	// launch in; a zone without one takes the default VPC's default subnet.
	Subnets map[string]string `yaml:"subnets"`
	// SecurityGroups are the groups replicas join; they must let the routers reach the
	// replica port (default: the VPC's default group).
	SecurityGroups []string `yaml:"security_groups"`
	// KeyName is an EC2 key pair for SSH into replicas (default: none).
	KeyName string `yaml:"key_name"`
	// InstanceProfile is the IAM instance profile (name or ARN) replicas run with.
	InstanceProfile string `yaml:"instance_profile"`
	// PublicIP addresses replicas by their public IP (routers outside the VPC); default:
	// the private IP.
	PublicIP bool `yaml:"public_ip"`
	// DiskGiB is the root volume size when the spec gives no resources.disk_size (default:
	// the AMI's own).
	DiskGiB int `yaml:"disk_gib"`
	// StartSeconds bounds how long an instance may stay pending before the launch gives up
	// and terminates it (default 600).
	StartSeconds float64 `yaml:"start_seconds"`
	// NoticePollSeconds is how often spot requests are polled for an interruption notice
	// (default 5; AWS gives two minutes).
	NoticePollSeconds float64 `yaml:"notice_poll_seconds"`
	// InterruptionQueues maps a region to the SQS queue an EventBridge rule there feeds
	// with EC2's spot interruption warnings and rebalance recommendations
	// (deploy/aws/interruption-queue.yaml makes both). Optional: spot requests are polled
	// either way, but the queue hears of an interruption at once and of a rebalance
	// recommendation at all. The queue must be this control plane's alone: it deletes
	// every message it reads.
	InterruptionQueues map[string]string `yaml:"interruption_queues"`
	// SQSEndpoint replaces SQS's regional endpoint (a VPC endpoint, or a local fake).
	SQSEndpoint string `yaml:"sqs_endpoint"`
	// StagingBucket is the S3 bucket a service's workdir is copied through: the control
	// plane packs the workdir (tar.gz, less what its .skyignore or .gitignore leaves out)
	// once per service version, uploads it under StagingPrefix named by its SHA-256 (an
	// unchanged workdir is not uploaded again), and each instance's user data fetches it
	// by a presigned URL into ~/sky_workdir, where setup and run then run. The control
	// plane's credentials need s3:PutObject and s3:GetObject on it (s3:ListBucket too, or
	// S3 answers 403 instead of 404 for a key not there yet); the instances need nothing.
	// Without it, a service with a workdir fails to launch, saying so.
	StagingBucket string `yaml:"staging_bucket"`
	// StagingPrefix is the key prefix of staged workdirs (default arbiter/workdirs/).
	StagingPrefix string `yaml:"staging_prefix"`
	// StagingRegion is the staging bucket's region (default: the first of regions).
	StagingRegion string `yaml:"staging_region"`
	// S3Endpoint replaces S3's regional endpoint (a VPC endpoint, or a local fake); it is
	// addressed path-style (ENDPOINT/BUCKET/KEY).
	S3Endpoint string `yaml:"s3_endpoint"`
	// SpotPriceSeconds is how long a zone's spot price from DescribeSpotPriceHistory is used
	// before it is asked again (default 300).
	SpotPriceSeconds float64 `yaml:"spot_price_seconds"`
}

// Config is what New needs beyond the account.
type Config struct {
	Account
	// Owner is the control plane's id, tagged on every instance: List finds what this
	// control plane launched by it, and nothing else.
	Owner string
	// Catalog prices on-demand capacity and names the instance type of each accelerator;
	// nil: the embedded catalogs.
	Catalog func() (*pricing.Catalog, error)
	// PollInterval is how often a launch or termination asks for the instance's state
	// (default 2 s).
	PollInterval time.Duration
	// NotFoundGrace is how long an instance just created may be unknown to
	// DescribeInstances (EC2 is eventually consistent) before it counts as gone (default 2 min).
	NotFoundGrace time.Duration
	Now           func() time.Time
	Log           *slog.Logger
}

var (
	regionRE = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-\d+$`)
	// bucketRE is S3's bucket naming rule, in short
	// (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).
	bucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
)

// Check reports an account section that cannot work.
func (a *Account) Check() error {
	for _, r := range a.Regions {
		if !regionRE.MatchString(r) {
			return fmt.Errorf("regions: %q is not an AWS region name (e.g. us-east-1)", r)
		}
	}
	for _, e := range []struct{ field, url string }{{"endpoint", a.Endpoint}, {"sqs_endpoint", a.SQSEndpoint}, {"s3_endpoint", a.S3Endpoint}} {
		if e.url != "" && !isHTTPURL(e.url) {
			return fmt.Errorf("%s: %q is not an http(s) URL", e.field, e.url)
		}
	}
	for region, q := range a.InterruptionQueues {
		if !regionRE.MatchString(region) {
			return fmt.Errorf("interruption_queues: %q is not an AWS region name (e.g. us-east-1)", region)
		}
		if len(a.Regions) > 0 && !slices.Contains(a.Regions, region) {
			return fmt.Errorf("interruption_queues: %s is not one of regions (%s)", region, strings.Join(a.Regions, ", "))
		}
		if !isHTTPURL(q) {
			return fmt.Errorf("interruption_queues: %s: %q is not a queue URL (https://sqs.%s.amazonaws.com/ACCOUNT/NAME)", region, q, region)
		}
	}
	if a.StagingBucket != "" && !bucketRE.MatchString(a.StagingBucket) {
		return fmt.Errorf("staging_bucket: %q is not an S3 bucket name (3 to 63 of a-z, 0-9, '.', '-'; no s3:// and no prefix: give that as staging_prefix)", a.StagingBucket)
	}
	if strings.HasPrefix(a.StagingPrefix, "/") {
		return fmt.Errorf("staging_prefix: %q: an S3 key prefix does not start with /", a.StagingPrefix)
	}
	if a.StagingRegion != "" && !regionRE.MatchString(a.StagingRegion) {
		return fmt.Errorf("staging_region: %q is not an AWS region name (e.g. us-east-1)", a.StagingRegion)
	}
	if strings.HasPrefix(a.Image, "ami-") && strings.ContainsAny(a.Image, " *?") {
		return fmt.Errorf("image: %q is neither an AMI id nor a name pattern", a.Image)
	}
	for _, v := range []struct {
		name string
		v    float64
	}{{"start_seconds", a.StartSeconds}, {"notice_poll_seconds", a.NoticePollSeconds}, {"spot_price_seconds", a.SpotPriceSeconds}} {
		if v.v < 0 {
			return fmt.Errorf("%s: must be ≥ 0, got %g", v.name, v.v)
		}
	}
	if a.DiskGiB < 0 {
		return errors.New("disk_gib: must be ≥ 0")
	}
	return nil
}

func (c *Config) defaults() {
	if c.Image == "" {
		c.Image = DefaultImageName
	}
	if len(c.ImageOwners) == 0 {
		c.ImageOwners = []string{"amazon"}
	}
	if c.StagingPrefix == "" {
		c.StagingPrefix = "arbiter/workdirs/"
	}
	if c.StartSeconds == 0 {
		c.StartSeconds = 600
	}
	if c.NoticePollSeconds == 0 {
		c.NoticePollSeconds = 5
	}
	if c.SpotPriceSeconds == 0 {
		c.SpotPriceSeconds = 300
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 2 * time.Second
	}
	if c.NotFoundGrace <= 0 {
		c.NotFoundGrace = 2 * time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Catalog == nil {
		c.Catalog = pricing.Embedded
	}
}

func isHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

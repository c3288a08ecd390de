package aws

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/arbiter-serve/arbiter/internal/workdir"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/spec"
)

// A service's workdir reaches its VMs as SkyPilot's does (rsynced to ~/sky_workdir, where
// setup and run run), through S3 instead of SSH: the control plane packs it once per
// service version and uploads it to the staging bucket under its SHA-256, and each
// instance's user data fetches it by a presigned GET URL with curl, checks the digest and
// unpacks it. A presigned URL rather than aws s3 cp: the AMI needs no AWS CLI and the
// instances no instance profile that reads the staging bucket; the URL (valid for
// workdirURLValidity) reads that one object only. Like the rest of the user data, it is
// readable by whoever may call ec2:DescribeInstanceAttribute: a workdir is code, and
// secrets are refused on aws (spec).

// workdirURLValidity is how long a presigned URL of a staged workdir works: an instance
// fetches it within start_seconds of its launch, at first boot. With temporary
// credentials (a role) the URL ends with them, sooner if they expire first.
func (p *Provider) workdirURLValidity() time.Duration {
	return max(time.Hour, 2*seconds(p.cfg.StartSeconds))
}

// stagedWorkdir is a workdir uploaded to the staging bucket.
type stagedWorkdir struct {
	key, sha256 string
	size        int64
}

// workdirFetch is what one instance's user data needs to fetch the workdir.
type workdirFetch struct {
	url, sha256 string
}

// workdirFor stages ls's workdir (once per service version) and presigns its fetch; nil
// when the spec has none.
func (p *Provider) workdirFor(ctx context.Context, ls replicas.LaunchSpec) (*workdirFetch, error) {
	if ls.Workdir == "" {
		return nil, nil
	}
	if p.cfg.StagingBucket == "" {
		return nil, fmt.Errorf("aws: workdir %s: the aws provider copies a workdir to its VMs through S3: give staging_bucket (a bucket the control plane may s3:PutObject and s3:GetObject in) in the providers file's aws section", ls.Workdir)
	}
	st, err := p.stage(ctx, ls)
	if err != nil {
		return nil, err
	}
	c := p.s3Client()
	req, err := s3.NewPresignClient(c).PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(p.cfg.StagingBucket), Key: aws.String(st.key)},
		s3.WithPresignExpires(p.workdirURLValidity()))
	if err != nil {
		return nil, fmt.Errorf("aws: workdir %s: presign s3://%s/%s: %w", ls.Workdir, p.cfg.StagingBucket, st.key, err)
	}
	return &workdirFetch{url: req.URL, sha256: st.sha256}, nil
}

// stage packs and uploads a version's workdir unless this process already did; the
// upload is skipped when the bucket already holds an object of that digest (an unchanged
// workdir, or a restarted control plane).
func (p *Provider) stage(ctx context.Context, ls replicas.LaunchSpec) (stagedWorkdir, error) {
	dir, err := spec.ExpandWorkdir(ls.Workdir)
	if err != nil {
		return stagedWorkdir{}, fmt.Errorf("aws: workdir %s: %w", ls.Workdir, err)
	}
	ck := ls.Service + "\x00" + strconv.Itoa(ls.Version) + "\x00" + dir
	p.mu.Lock()
	st, ok := p.staged[ck]
	p.mu.Unlock()
	if ok {
		return st, nil
	}
	v, err, _ := p.staging.Do(ck, func() (any, error) {
		a, err := workdir.Pack(dir, "")
		if err != nil {
			return nil, fmt.Errorf("aws: workdir: %w", err)
		}
		defer os.Remove(a.Path)
		st := stagedWorkdir{key: p.cfg.StagingPrefix + a.SHA256 + ".tar.gz", sha256: a.SHA256, size: a.Size}
		where := "s3://" + p.cfg.StagingBucket + "/" + st.key
		c := p.s3Client()
		head, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(p.cfg.StagingBucket), Key: aws.String(st.key)})
		switch {
		case err == nil && aws.ToInt64(head.ContentLength) == a.Size:
			p.cfg.Log.Info("aws workdir already staged", "service", ls.Service, "version", ls.Version, "workdir", dir, "object", where)
		// 404: not there yet. 403: not there, or there, to credentials without
		// s3:ListBucket (S3 will not say which); the PUT then tells.
		case err == nil || httpStatus(err) == http.StatusNotFound || httpStatus(err) == http.StatusForbidden:
			if err := p.putWorkdir(ctx, c, a, st.key); err != nil {
				return nil, stagingError(err, "PutObject", where)
			}
			p.cfg.Log.Info("aws workdir staged", "service", ls.Service, "version", ls.Version, "workdir", dir, "files", a.Files,
				"bytes", a.Bytes, "packed", a.Size, "object", where)
		default:
			return nil, stagingError(err, "HeadObject", where)
		}
		p.mu.Lock()
		p.staged[ck] = st
		p.mu.Unlock()
		return st, nil
	})
	if err != nil {
		return stagedWorkdir{}, err
	}
	return v.(stagedWorkdir), nil
}

func (p *Provider) putWorkdir(ctx context.Context, c *s3.Client, a workdir.Archive, key string) error {
	f, err := os.Open(a.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	sum, err := hex.DecodeString(a.SHA256)
	if err != nil {
		return err
	}
	// S3 checks the body against the digest (400 BadDigest otherwise); the SDK's
	// retryer rewinds the file for a retry (503 SlowDown).
	_, err = c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(p.cfg.StagingBucket), Key: aws.String(key), Body: f,
		ContentLength: aws.Int64(a.Size), ContentType: aws.String("application/gzip"),
		ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(sum))})
	return err
}

// stagingError says what the staging bucket answered, and for a refusal what the control
// plane's credentials lack.
func stagingError(err error, op, where string) error {
	var ae smithy.APIError
	if httpStatus(err) == http.StatusForbidden || (errors.As(err, &ae) && ae.ErrorCode() == "AccessDenied") {
		return fmt.Errorf("aws: workdir: %s %s: S3 refused it (403): the control plane's credentials need s3:PutObject, s3:GetObject and s3:ListBucket on the staging bucket (see deploy/aws/iam-policy.json): %w", op, where, err)
	}
	return fmt.Errorf("aws: workdir: %s %s: %w", op, where, err)
}

// httpStatus is the HTTP status of an API error's response (0 if none).
func httpStatus(err error) int {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// s3Client is the staging bucket's client (path-style where an endpoint replaces S3's).
func (p *Provider) s3Client() *s3.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.s3 == nil {
		p.s3 = s3.NewFromConfig(p.base, func(o *s3.Options) {
			o.Region = p.cfg.StagingRegion
			if o.Region == "" {
				o.Region = p.cfg.Regions[0]
			}
			if p.cfg.S3Endpoint != "" {
				o.BaseEndpoint = aws.String(p.cfg.S3Endpoint)
				o.UsePathStyle = true
			}
		})
	}
	return p.s3
}

package pricing

import (
	"math"
	"testing"
	"testing/fstest"
	"time"
)

// anyHead is the header and rows of gpu_price_changelog.csv (an Azure flip, a Lambda
// disappearance).
const anyHead = `observed_at,commit,event,cloud,row_kind,InstanceType,AcceleratorName,AcceleratorCount,Region,AvailabilityZone,Price,SpotPrice
2026-04-02T11:17:42-05:00,0f0e0d0c0b0a,first_seen,azure,vm_with_accelerator,Standard_NC24ads_A100_v4,A100-80GB,1,eastus,,3.673,0.67877
2026-05-01T04:45:28+00:00,0f0e0d0c0b0b,changed,azure,vm_with_accelerator,Standard_NC24ads_A100_v4,A100-80GB,1,eastus,,4.777,0.67877
2026-05-07T04:37:46+00:00,5bdbfd4508f7,disappeared,lambda,vm_with_accelerator,gpu_1x_h100_pcie,H100,1.0,us-east-1,,,
`

// FuzzLoad feeds malformed catalogs to the loader: it must return an error or offers
// whose prices are finite and normalised, never panic.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(awsHead), []byte(anyHead))
	f.Add([]byte(awsHead+"p5.48xlarge,H100,8.0,192.0,2048.0,98.32,,us-east-1,use1-az1\n"), []byte(""))
	f.Add([]byte("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone\nx,A10,0.333,,,1e308,-1,r,z\n"), []byte(anyHead[:200]))
	f.Fuzz(func(t *testing.T, aws, anycloud []byte) {
		c, err := LoadFS(fstest.MapFS{fileAWS: {Data: aws}, fileAnyLog: {Data: anycloud}})
		if err != nil {
			return
		}
		for _, at := range []time.Time{{}, time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)} {
			for _, o := range c.Offers(at) {
				if o.AcceleratorCount < 1 || math.IsNaN(o.PricePerHour) || math.IsInf(o.PricePerGPUHour, 0) || o.PricePerHour < 0 {
					t.Fatalf("bad offer %+v", o)
				}
			}
		}
	})
}

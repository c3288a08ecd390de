// Package pricing loads real GPU price catalogs and quotes a service's resources: against
// them: which (provider, region, zone, instance type, capacity kind) can run one replica, and
// what it costs per hour, per instance and per GPU.
//
// The data are the files under shared/data/gpu_prices/ (SkyPilot's vms.csv format for AWS
// and, through the anycloud-sh mirror, GCP, Azure, Lambda and Vast; GCP's billing-catalog
// history; AWS's p5 on-demand history and Spot Advisor). Load reads them from a directory,
// Embedded from the gzipped copies in catalogs/, so a binary needs no data directory.
// Nothing here makes up a price: every figure is a value from those files, the sum of two
// of them where a source splits one machine's price in two (GCP host VM + GPUs), or one of
// them picked by a documented rule where sources overlap. catalogs/README.md lists the
// rules; the tests pin concrete rows.
//
// Prices change over time: change logs are replayed, so Offers and Quote take the time at
// which prices are wanted. A Catalog is immutable once loaded and safe for concurrent use.
package pricing

output "network_id" {
  value = testcloud_network.main.id
}

output "cluster_id" {
  value = testcloud_cluster.main.id
}

output "endpoint" {
  value = testcloud_cluster.main.endpoint
}

output "admin_url" {
  value     = "https://admin:${var.admin_password}@${testcloud_cluster.main.name}.${var.region}.testcloud.local"
  sensitive = true
}

variable "cluster_name" {
  type = string
}

variable "region" {
  type = string
}

variable "node_count" {
  type = number
}

variable "instance_type" {
  type = string
}

variable "cidr" {
  type = string
}

variable "ha" {
  type = bool
}

variable "admin_password" {
  type      = string
  sensitive = true
}

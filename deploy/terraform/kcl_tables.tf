# The two tables of a kcl application: the lease table (named after the
# application unless the worker sets table_name) and the liveness records'
# table (<lease table>-workers). Apply, then run the workers with
# table_creation = never (KCL_TABLE_CREATION=never).

variable "lease_table_name" {
  type        = string
  description = "The lease table: the application name, or the worker's table_name."
}

variable "kms_key_arn" {
  type        = string
  default     = null
  description = "A KMS key ARN; null for the AWS-owned key."
}

resource "aws_dynamodb_table" "kcl_leases" {
  name                        = var.lease_table_name
  billing_mode                = "PAY_PER_REQUEST"
  hash_key                    = "leaseKey"
  deletion_protection_enabled = true

  attribute {
    name = "leaseKey"
    type = "S"
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = var.kms_key_arn != null
    kms_key_arn = var.kms_key_arn
  }

  tags = {
    app = var.lease_table_name
  }
}

resource "aws_dynamodb_table" "kcl_workers" {
  name         = "${var.lease_table_name}-workers"
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "instance"

  attribute {
    name = "instance"
    type = "S"
  }

  server_side_encryption {
    enabled     = var.kms_key_arn != null
    kms_key_arn = var.kms_key_arn
  }

  tags = {
    app = var.lease_table_name
  }
}
